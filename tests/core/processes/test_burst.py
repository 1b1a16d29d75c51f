"""`run_worker --burst` stops once nothing is ready or in flight, and not before: items ready but held back (the
next item of an ordering key, a queue at its rate limit, a group at its group limit) keep it working. Real
`--burst` processes, thread and process pools; assertions on what the database recorded and on the worker's exit,
never on wall time."""

from datetime import timedelta

import pytest

from queue_app import engine, services
from queue_app.models import ExecutionLog, ItemState, QueueItem
from queue_app.registry import get_task
from tests.support.queue_helpers import leases_per_window
from tests.support.waiting import wait_for
from tests.support.worker_helpers import finish, output

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = "queue_app.probe"
POOLS = pytest.mark.parametrize("pool", ["thread", "process"])
HELD_BACK = "burst: items ready but held back"
STOPPED = "burst: nothing ready and nothing in flight; stopping"


def burst(worker, name: str, pool: str, queue: str, *args: str):
    return worker(name, "--burst", "--pool", pool, "--concurrency", "2", "--queues", queue, "--no-scheduler", *args)


def states(queue: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in QueueItem.objects.filter(queue_id=queue).values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


@POOLS
def test_one_burst_run_finishes_every_item_of_an_ordering_key_in_order(worker, pool):
    ids = get_task(PROBE).enqueue_many([{}] * 6, queue="ordered", ordering_key="account-7")
    proc = burst(worker, "ordered", pool, "ordered")

    assert finish(proc, timeout=120) == 0, output(proc)[-3000:]
    assert states("ordered") == {ItemState.DONE: 6}, output(proc)[-3000:]
    # One run each, in enqueue order (each started after the one before it was settled: one in flight per key).
    assert list(ExecutionLog.objects.order_by("id").values_list("item_id", flat=True)) == ids
    assert STOPPED in output(proc)


@POOLS
def test_a_burst_worker_waits_out_a_rate_limit_and_finishes_the_queue(worker, pool):
    limit, period = 2, 2
    engine.ensure_queue("metered")
    services.set_queue_options("metered", rate_limit=limit, rate_period=period)
    get_task(PROBE).enqueue_many([{}] * 6, queue="metered")
    proc = burst(worker, "metered", pool, "metered")

    assert finish(proc, timeout=120) == 0, output(proc)[-3000:]
    assert states("metered") == {ItemState.DONE: 6}, output(proc)[-3000:]
    windows = leases_per_window("metered", period)
    assert max(windows.values()) <= limit and len(windows) >= 3, windows  # the limit kept: it waited for windows
    assert HELD_BACK in output(proc)


@POOLS
def test_a_burst_worker_waits_for_a_group_held_by_another_worker(worker, pool):
    engine.ensure_queue("tenants")
    services.set_queue_options("tenants", group_concurrency=1)
    get_task(PROBE).enqueue_many([{}] * 4, queue="tenants", group_key="acme")
    # Another worker holds one item of the group: the group is at its limit, its three others ready but held back.
    (held,) = engine.lease(["tenants"], 1, "another-worker", lease_timeout=600)
    proc = burst(worker, "tenants", pool, "tenants")

    wait_for(lambda: HELD_BACK in output(proc) or proc.poll() is not None, timeout=60, what="the burst worker to wait")
    assert proc.poll() is None, output(proc)[-3000:]  # waiting, not gone
    assert states("tenants") == {ItemState.READY: 3, ItemState.RESERVED: 1}  # and it took nothing meanwhile
    engine.complete_many([(held, None)])  # the other worker finishes: the group has room again

    assert finish(proc, timeout=120) == 0, output(proc)[-3000:]
    assert states("tenants") == {ItemState.DONE: 4}, output(proc)[-3000:]
    assert STOPPED in output(proc)


def test_a_burst_worker_stops_when_what_is_left_is_delayed_or_behind_a_delayed_item_of_its_key(worker):
    probe = get_task(PROBE)
    probe.enqueue({}, queue="later", ordering_key="k", delay=timedelta(hours=1))
    probe.enqueue({}, queue="later", ordering_key="k")  # ready, but behind an item not due for an hour
    probe.enqueue({}, queue="later", delay=timedelta(hours=1))
    proc = burst(worker, "later", "thread", "later")

    assert finish(proc, timeout=120) == 0, output(proc)[-3000:]
    assert STOPPED in output(proc) and HELD_BACK not in output(proc)
    assert states("later") == {ItemState.READY: 3} and not ExecutionLog.objects.exists()
