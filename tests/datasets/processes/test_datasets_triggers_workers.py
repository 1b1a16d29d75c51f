"""Data-aware triggers with real worker processes (tests/tasks/trigger_tasks.py, loaded by `run_worker --import
tests.tasks.trigger_declared`): three workers on threads record upstream partitions concurrently, each holding its
transaction open a random while so the two upstreams of a partition overlap; the consumers record their own
output dataset, so "ran once" is one output materialization per partition.

- all (tt_a and tt_b): every partition's consumer runs exactly once, after both upstreams;
- any: once per upstream materialization;
- a run that wrote and then failed (its transaction rolled back) triggers nothing;
- three updates of tt_c inside the 1.5 s debounce window: one run.

The negatives wait on the event that would prove them: every queue drained (the consumers' items are queued in
the upstreams' transactions and the debounce timers are items too), so no run can come later.
"""

import random

import pytest
from django.db import connection

from queue_app import engine
from queue_app.datasets.models import Materialization, TriggerFire
from tests.support.waiting import drained
from tests.tasks import trigger_tasks

pytestmark = pytest.mark.django_db(transaction=True)
PARTITIONS = [f"2026-10-{d:02d}" for d in range(1, 16)]
FAILED = "2026-10-20"


@pytest.fixture
def declared():
    trigger_tasks.declare()
    yield
    trigger_tasks.undeclare()


def outputs(dataset):
    found = {}
    for m in Materialization.objects.filter(dataset=dataset):
        found.setdefault(m.partition, []).append(m)
    return found


@pytest.mark.slow  # real run_worker processes
def test_real_workers_run_each_consumer_once_per_upstream_set(declared, worker):
    rng = random.Random(38)
    items = []
    for day in PARTITIONS:
        for name in ("tt_a", "tt_b"):
            items.append({"dataset": name, "partition": day, "hold": rng.uniform(0, 0.15)})
    items += [
        {"dataset": "tt_a", "partition": FAILED, "fail": True},
        {"dataset": "tt_b", "partition": FAILED},
    ]
    rng.shuffle(items)
    engine.enqueue_many("tests.trig_upstream", items)
    for delay in (0, 0.4, 0.8):  # three updates inside the debounce window
        engine.enqueue("tests.trig_upstream", {"dataset": "tt_c", "partition": "2026-10-01"}, delay=delay)
    for name in ("w1", "w2", "w3"):
        worker(name, "--concurrency", "4", "--pool", "thread", "--import", "tests.tasks.trigger_declared")
    drained(60)  # delayed items and the debounce timer are `ready` until they have run

    ran = outputs("tt_all_out")
    assert sorted(ran) == PARTITIONS  # not the failed partition: its tt_a was never recorded
    upstream = {(m.dataset, m.partition): m for m in Materialization.objects.filter(dataset__in=["tt_a", "tt_b"])}
    for day, runs in ran.items():
        assert len(runs) == 1, (day, runs)
        a, b = upstream["tt_a", day], upstream["tt_b", day]
        assert runs[0].metadata["upstream"] == {"tt_a": a.id, "tt_b": b.id}
        assert runs[0].at >= max(a.at, b.at)  # none before its upstreams
    assert ("tt_a", FAILED) not in upstream
    any_runs = outputs("tt_any_out")
    assert {day: len(r) for day, r in any_runs.items()} == {**dict.fromkeys(PARTITIONS, 2), FAILED: 1}
    assert len(outputs("tt_deb_out")["2026-10-01"]) == 1
    assert Materialization.objects.filter(dataset="tt_c").count() == 3
    assert TriggerFire.objects.filter(consumer="task:tests.trig_all").count() == len(PARTITIONS)
    with connection.cursor() as cursor:  # the failed upstream's item ended dead, not retried into a record
        cursor.execute("SELECT count(*) FROM queue_app_queueitem WHERE task = 'tests.trig_upstream' AND state = 'dead'")
        assert cursor.fetchone()[0] == 1


@pytest.mark.slow  # real run_worker processes
def test_real_workers_fire_each_mapped_consumer_once_per_set_of_upstream_partitions(declared, worker):
    """Two workers record three weeks of tt_daily and ten days of tt_region in three regions, in a random order
    with random holds, so the partitions one mapped consumer partition reads are recorded in overlapping
    transactions: the weekly rollup (TimeWindow to weekly) fires once per week, after its seven days, and the
    fan-in (AllOf region) once per day, after its three regions."""
    rng = random.Random(48)
    days = [f"2026-11-{d:02d}" for d in range(2, 23)]  # Monday 2026-11-02 (W45) to Sunday 11-22 (W47)
    region_days = days[:10]
    items = [{"dataset": "tt_daily", "partition": day, "hold": rng.uniform(0, 0.1)} for day in days]
    items += [
        {"dataset": "tt_region", "partition": f"{day}|{region}", "hold": rng.uniform(0, 0.1)}
        for day in region_days
        for region in trigger_tasks.REGIONS
    ]
    rng.shuffle(items)
    engine.enqueue_many("tests.trig_upstream", items)
    for name in ("w1", "w2"):
        worker(name, "--concurrency", "4", "--pool", "thread", "--import", "tests.tasks.trigger_declared")
    drained(60)

    weekly = outputs("tt_weekly_out")
    assert sorted(weekly) == ["2026-W45", "2026-W46", "2026-W47"]
    recorded = {m.partition: m for m in Materialization.objects.filter(dataset="tt_daily")}
    for week, runs in weekly.items():
        assert len(runs) == 1, (week, runs)
        read = runs[0].metadata["upstream"]
        assert len(read) == 7 and all(recorded[k[len("tt_daily[") : -1]].id == v for k, v in read.items())
        assert runs[0].at >= max(recorded[k[len("tt_daily[") : -1]].at for k in read)
    fan_in = outputs("tt_regions_out")
    assert sorted(fan_in) == region_days and all(len(runs) == 1 for runs in fan_in.values())
    assert all(len(runs[0].metadata["upstream"]) == 3 for runs in fan_in.values())
    assert TriggerFire.objects.filter(consumer="task:tests.trig_weekly").count() == 3
