"""Flow control kept by several real `run_worker` processes on one database: a queue's rate limit per window,
its group limit per key and its concurrency limit (on the leases: a sampler reads the live reservations, one
snapshot at a time), and fair turns between a big and a small group key. Assertions are on what the database
recorded or held, never on wall time."""

from collections import Counter

import pytest
from django.db import connection

from queue_app import engine, services
from queue_app.models import Reservation, Worker
from queue_app.registry import get_task
from tests.support.lease_sampler import LiveReservations
from tests.support.queue_helpers import leases_per_window
from tests.support.waiting import wait_for
from tests.support.worker_helpers import finish, open_items

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = "queue_app.probe"
NOOP = "queue_app.noop"


@pytest.fixture(autouse=True)
def empty_table_statistics():
    """Leave the statistics of empty tables behind (they are not rolled back or flushed, and the plan tests after
    these plan on them), as the other tests with big queues do."""
    yield
    with connection.cursor() as cur:
        cur.execute("TRUNCATE queue_app_queueitem, queue_app_reservation CASCADE")
        cur.execute("ANALYZE queue_app_queueitem")
        cur.execute("ANALYZE queue_app_reservation")


def stop(procs) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        assert finish(proc, timeout=30) == 0


def test_rate_limit_holds_across_four_workers_window_after_window(worker):  # noqa: F811
    limit, period, asleep = 5, 2, 0.6
    engine.ensure_queue("partner-api")
    services.set_queue_options("partner-api", rate_limit=limit, rate_period=period)
    # One slot each and a handler of 0.6 s: one worker alone starts at most 4 items in a 2 s window, so a window of
    # 5 needs a second worker. All four are running before the first item exists, so none gets a head start.
    procs = [worker(f"rate{n}", "--pool", "thread", "--concurrency", "1", "--queues", "partner-api") for n in range(4)]
    wait_for(lambda: Worker.objects.filter(state="running").count() == 4, timeout=60, what="four running workers")
    get_task(PROBE).enqueue_many([{"sleep": asleep}] * 30, queue="partner-api")

    # Five windows of leases: the first and the last may be partial, the three between are whole.
    wait_for(lambda: len(leases_per_window("partner-api", period)) >= 6, timeout=60, what="six rate windows")
    stop(procs)

    windows = leases_per_window("partner-api", period)
    assert max(windows.values()) <= limit  # never more, in any window
    whole = sorted(windows)[1:-1][:3]
    assert len(whole) == 3 and all(limit - 1 <= windows[w] <= limit for w in whole), windows
    assert len({r.worker_id for r in Reservation.objects.all()}) >= 2  # the workers shared the windows


def run_sampled(worker, queue: str, fill, slots: int = 4) -> LiveReservations:
    """Three real workers of `slots` slots each, all running before `fill()` enqueues (so none drains the queue
    alone while the others start up), serve `queue` until every item is settled, under the sampler."""
    live = LiveReservations(queue)
    live.start()
    procs = [
        worker(f"{queue}{n}", "--pool", "thread", "--concurrency", str(slots), "--queues", queue) for n in range(3)
    ]
    wait_for(lambda: Worker.objects.filter(state="running").count() == 3, timeout=60, what="three running workers")
    fill()
    wait_for(lambda: open_items() == 0, timeout=90, what="every item to be settled")
    live.stop()
    stop(procs)
    return live


def settled_once_each(queue: str) -> Counter:
    """Per item of the queue, its reservations (attempts): every one leased once and settled done."""
    rows = Reservation.objects.filter(item__queue_id=queue).values_list("item_id", "outcome")
    assert {outcome for _, outcome in rows} == {"done"}
    return Counter(item_id for item_id, _ in rows)


def test_group_limit_is_never_exceeded_across_workers(worker):  # noqa: F811
    limit, asleep = 2, 0.4
    engine.ensure_queue("tenants")
    services.set_queue_options("tenants", group_concurrency=limit)
    probe = get_task(PROBE)

    def fill():
        for key in ("a", "b", "c"):
            probe.enqueue_many([{"sleep": asleep}] * 6, queue="tenants", group_key=key)

    live = run_sampled(worker, "tenants", fill)

    assert sorted(settled_once_each("tenants").values()) == [1] * 18
    # At every sampled instant each key held at most `limit` live leases, and each reached it.
    assert live.most_per_key == {"a": limit, "b": limit, "c": limit}, (live.most_per_key, live.samples)
    assert len({r.worker_id for r in Reservation.objects.all()}) >= 2  # the workers shared the keys


def test_concurrency_limit_is_never_exceeded_across_workers(worker):  # noqa: F811
    limit, asleep = 3, 0.3
    engine.ensure_queue("limited")
    services.set_queue_options("limited", concurrency_limit=limit)
    # Six slots in all, two a worker: only the queue's limit holds the leases to three, and reaching three takes
    # two workers (with four slots one worker could hold all three, re-leasing as it settles, and share nothing).
    live = run_sampled(
        worker, "limited", lambda: get_task(PROBE).enqueue_many([{"sleep": asleep}] * 24, queue="limited"), slots=2
    )

    assert sorted(settled_once_each("limited").values()) == [1] * 24
    assert live.most == limit, (live.most, live.samples)  # reached at some instant, exceeded at none
    assert len({r.worker_id for r in Reservation.objects.all()}) >= 2


def test_a_small_group_key_is_not_starved_by_a_big_one(worker):  # noqa: F811
    big, small, batch = 3_000, 30, 10
    engine.ensure_queue("tenants")
    services.set_queue_options("tenants", fair=True)
    get_task(NOOP).enqueue_many([{}] * big, queue="tenants", group_key="big")
    get_task(NOOP).enqueue_many([{}] * small, queue="tenants", group_key="small")
    args = ("--burst", "--pool", "thread", "--concurrency", "5", "--batch", str(batch), "--queues", "tenants")
    procs = [worker(f"fair{n}", *args) for n in range(2)]
    for proc in procs:  # --burst: each exits by itself once nothing is left
        assert finish(proc, timeout=120) == 0

    order = [
        key for key in Reservation.objects.order_by("id").values_list("item__group_key", flat=True) if key is not None
    ]
    last_small = max(i for i, key in enumerate(order) if key == "small")
    assert Counter(order) == {"big": big, "small": small}
    # Leased in turn: the small key's items went out within a few batches of the big key's, not after its 3,000.
    assert last_small < 2 * small + 4 * batch, f"the last small item was lease number {last_small + 1}"
