"""queue_chaos --waits --quick passes end to end: real workers killed with -9 and PostgreSQL restarted once while
240 workflows sleep and wait for events another process sends (some before the workflows exist, some during the
sleep, some twice; a send the restart breaks is sent again, never twice); every
check of queue_app/chaos/waits.py passes (each event wakes exactly one step once, no wait lost, nothing early)."""

import os
import subprocess
import sys

import pytest

from tests.test_chaos import ROOT, _has_postgres_binaries

CHECKS = (
    "every workflow succeeded",
    "every event sent stored once",
    "every event woke exactly one step once",
    "the step after each wait ran once",
    "nothing woke early",
    "workers behaved",
)


@pytest.mark.slow
@pytest.mark.skipif(not _has_postgres_binaries(), reason="no PostgreSQL server binaries for a private cluster")
def test_quick_waits_chaos_run_passes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(JOBSITE_NO_BOOTSTRAP="1", JOBSITE_VAR_DIR=str(tmp_path / "var"))
    manage = [sys.executable, str(ROOT / "manage.py")]
    try:
        result = subprocess.run(
            [*manage, "queue_chaos", "--waits", "--quick", "--seed", "5"],
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
    assert f"RESULT: PASS ({len(CHECKS)}/{len(CHECKS)} checks passed)" in out
    for check in CHECKS:
        assert any(line.startswith(check) and " PASS " in line for line in out.splitlines()), check
    assert "FAULT kill -9" in out
    assert "FAULT PostgreSQL restart" in out and "; restart: at " in out
    assert any(line.startswith("workers behaved") and "restarts=1" in line for line in out.splitlines())
