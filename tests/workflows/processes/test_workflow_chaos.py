"""queue_chaos --workflow --quick passes end to end: real workers killed with -9 while a fan-out/fan-in workflow
and a compensation-path workflow run (~250 steps, two of them sub-workflow steps); every check of
jobsite/chaos/workflow.py passes."""

import pytest

from tests.support.chaos_runs import _has_postgres_binaries, run_quick_chaos


@pytest.mark.slow
@pytest.mark.skipif(not _has_postgres_binaries(), reason="no PostgreSQL server binaries for a private cluster")
def test_quick_workflow_chaos_run_passes(tmp_path):
    out = run_quick_chaos(tmp_path, "--workflow", "--seed", "11").stdout
    assert "RESULT: PASS (7/7 checks passed)" in out
    for check in (
        "no workflow stuck",
        "each fan-in fired once",
        "no step before its dependencies",
        "each child ran once, its step ended once",
    ):
        assert any(line.startswith(check) and " PASS " in line for line in out.splitlines()), check
    assert "FAULT kill -9" in out
