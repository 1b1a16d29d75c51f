"""queue_chaos --workflow --quick passes end to end: real workers killed with -9 while a fan-out/fan-in workflow
and a compensation-path workflow run (~250 steps); every check of queue_app/chaos/workflow.py passes."""

import os
import subprocess
import sys

import pytest

from tests.test_chaos import ROOT, _has_postgres_binaries


@pytest.mark.slow
@pytest.mark.skipif(not _has_postgres_binaries(), reason="no PostgreSQL server binaries for a private cluster")
def test_quick_workflow_chaos_run_passes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(JOBSITE_NO_BOOTSTRAP="1", JOBSITE_VAR_DIR=str(tmp_path / "var"))
    manage = [sys.executable, str(ROOT / "manage.py")]
    try:
        result = subprocess.run(
            [*manage, "queue_chaos", "--workflow", "--quick", "--seed", "11"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        subprocess.run([*manage, "embedded_db", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    out = result.stdout
    assert "RESULT: PASS (6/6 checks passed)" in out
    for check in ("no workflow stuck", "each fan-in fired once", "no step before its dependencies"):
        assert any(line.startswith(check) and " PASS " in line for line in out.splitlines()), check
    assert "FAULT kill -9" in out
