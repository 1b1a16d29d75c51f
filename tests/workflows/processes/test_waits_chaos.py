"""queue_chaos --waits --quick passes end to end: real workers killed with -9 and PostgreSQL restarted once while
240 workflows sleep and wait for events another process sends (some before the workflows exist, some during the
sleep, some twice; a send the restart breaks is sent again, never twice); every
check of jobsite/chaos/waits.py passes (each event wakes exactly one step once, no wait lost, nothing early)."""

import pytest

from tests.support.chaos_runs import _has_postgres_binaries, run_quick_chaos

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
    out = run_quick_chaos(tmp_path, "--waits", "--seed", "5").stdout
    assert f"RESULT: PASS ({len(CHECKS)}/{len(CHECKS)} checks passed)" in out
    for check in CHECKS:
        assert any(line.startswith(check) and " PASS " in line for line in out.splitlines()), check
    assert "FAULT kill -9" in out
    assert "FAULT PostgreSQL restart" in out and "; restart: at " in out
    assert any(line.startswith("workers behaved") and "restarts=1" in line for line in out.splitlines())
