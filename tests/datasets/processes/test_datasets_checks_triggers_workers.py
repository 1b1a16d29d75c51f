"""Blocking checks and data-aware triggers together, with three real workers (tests/tasks/checks_triggers_tasks.py):
the upstreams ctr_a and ctr_b of eight partitions are recorded concurrently, three partitions' ctr_a marked bad so
its blocking check (run as a queue item by the same workers) fails. The `all` consumer runs exactly once for each
usable pair, never for a blocked partition; then an override of one bad partition and a new passing
materialization of another each run it exactly once more, and the third bad partition still runs nothing.

The negatives wait on the event that would prove them: every queue drained (the check items, and the consumers'
items queued in the transactions that made their last upstream usable), so no run can come later.
"""

import random

import pytest
from django.contrib.auth.models import User

from queue_app import engine
from queue_app.datasets.checks_run import override_failed_checks
from queue_app.datasets.models import Materialization, TriggerFire
from tests.support.waiting import drained
from tests.tasks import checks_triggers_tasks as ctr

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
DAYS = [f"2026-09-{d:02d}" for d in range(1, 9)]
OVERRIDDEN, REWRITTEN, STILL_BAD = "2026-09-03", "2026-09-05", "2026-09-07"
BAD = {OVERRIDDEN, REWRITTEN, STILL_BAD}


def rows(dataset: str) -> dict[str, list[Materialization]]:
    found: dict[str, list[Materialization]] = {}
    for m in Materialization.objects.filter(dataset=dataset).order_by("id"):
        found.setdefault(m.partition, []).append(m)
    return found


def test_the_consumer_runs_once_per_usable_set_and_never_for_a_blocked_partition(worker):
    ctr.declare()
    try:
        rng = random.Random(38)
        items = [
            {"dataset": name, "partition": day, "hold": rng.uniform(0, 0.1), "bad": name == "ctr_a" and day in BAD}
            for day in DAYS
            for name in ctr.UPSTREAMS
        ]
        rng.shuffle(items)
        engine.enqueue_many("tests.ctr_upstream", items)
        for name in ("ct1", "ct2", "ct3"):
            worker(name, "--concurrency", "3", "--pool", "thread", "--import", "tests.tasks.checks_triggers_declared")
        drained(120)

        a, b, out = rows("ctr_a"), rows("ctr_b"), rows(ctr.OUTPUT)
        assert {day: a[day][0].checks for day in DAYS} == {d: "failed" if d in BAD else "passed" for d in DAYS}
        assert sorted(out) == sorted(set(DAYS) - BAD)  # nothing for a blocked partition
        for day, runs in out.items():
            assert [r.metadata["upstream"] for r in runs] == [{"ctr_a": a[day][0].id, "ctr_b": b[day][0].id}]

        # An override of one, a new passing materialization of another: each runs the consumer once more.
        admin = User.objects.create_superuser("ctr-admin", "ctr@example.com", "x")
        override_failed_checks(admin, a[OVERRIDDEN][0], "known bad marker, data fine")
        engine.enqueue("tests.ctr_upstream", {"dataset": "ctr_a", "partition": REWRITTEN})
        drained(120)

        a, out = rows("ctr_a"), rows(ctr.OUTPUT)
        assert [m.checks for m in a[REWRITTEN]] == ["failed", "passed"]
        assert sorted(out) == sorted(set(DAYS) - {STILL_BAD})
        assert all(len(runs) == 1 for runs in out.values()), {d: len(r) for d, r in out.items()}
        assert out[OVERRIDDEN][0].metadata["upstream"] == {"ctr_a": a[OVERRIDDEN][0].id, "ctr_b": b[OVERRIDDEN][0].id}
        assert out[REWRITTEN][0].metadata["upstream"] == {"ctr_a": a[REWRITTEN][1].id, "ctr_b": b[REWRITTEN][0].id}
        assert TriggerFire.objects.filter(consumer=f"task:{ctr.CONSUMER}").count() == len(DAYS) - 1
    finally:
        ctr.undeclare()
