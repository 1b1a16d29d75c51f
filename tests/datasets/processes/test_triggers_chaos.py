"""queue_chaos --triggers --quick passes end to end: real workers killed with -9 while 150 partitions' two upstreams
are recorded (every tenth bad, failing its blocking check until overridden or recorded again) and the data-aware
trigger queues their consumer; every check of jobsite/chaos/triggers.py passes (each consumer queued once per
usable upstream set and run exactly once, never on a blocked partition nor before its upstreams, nothing stuck),
and the mapped consumers (a week of chaos_b's days, a fan-in over a dynamic set of sources) once per complete set;
dynamic keys removed and added again while their partitions are asked for: no run of a key after its removal."""

import pytest

from tests.support.chaos_runs import _has_postgres_binaries, run_quick_chaos

CHECKS = (
    "no item stuck",
    "every upstream recorded once",
    "bad records failed their blocking check",
    "each consumer queued once per usable set",
    "each consumer item ran exactly once",
    "no consumer before its upstreams",
    "each mapped consumer queued once per set",
    "dynamic keys: no run after removal",
    "workers behaved",
)


@pytest.mark.slow
@pytest.mark.skipif(not _has_postgres_binaries(), reason="no PostgreSQL server binaries for a private cluster")
def test_quick_triggers_chaos_run_passes(tmp_path):
    out = run_quick_chaos(tmp_path, "--triggers", "--seed", "3").stdout
    assert f"RESULT: PASS ({len(CHECKS)}/{len(CHECKS)} checks passed)" in out
    for check in CHECKS:
        assert any(line.startswith(check) and " PASS " in line for line in out.splitlines()), check
    assert "FAULT kill -9" in out
