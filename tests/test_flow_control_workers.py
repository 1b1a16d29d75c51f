"""Flow control kept by several real `run_worker` processes on one database: a queue's rate limit per window,
its group limit per key, and fair turns between a big and a small group key. Assertions are on what the
database recorded (reservations, handler starts), never on wall time."""

from collections import Counter, defaultdict

import pytest
from django.db import connection

from queue_app import engine, services
from queue_app.models import ExecutionLog, QueueItem, Reservation, Worker
from queue_app.registry import get_task
from tests.test_worker_processes import finish, open_items
from tests.waiting import wait_for

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


def leases_per_window(queue: str, period: int) -> dict[int, int]:
    """Leases (reservations) of the queue's items per rate window, by the window's number since the epoch."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT floor(extract(epoch FROM r.reserved_at) / %s)::bigint, count(*)
               FROM queue_app_reservation r JOIN queue_app_queueitem i ON i.id = r.item_id
               WHERE i.queue_id = %s GROUP BY 1 ORDER BY 1""",
            [period, queue],
        )
        return dict(cur.fetchall())


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


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_group_limit_is_never_exceeded_across_workers(worker):  # noqa: F811
    limit, asleep = 2, 0.4
    engine.ensure_queue("tenants")
    services.set_queue_options("tenants", group_concurrency=limit)
    probe = get_task(PROBE)
    for key in ("a", "b", "c"):
        probe.enqueue_many([{"sleep": asleep}] * 6, queue="tenants", group_key=key)
    procs = [worker(f"group{n}", "--pool", "thread", "--concurrency", "4", "--queues", "tenants") for n in range(3)]
    wait_for(lambda: open_items() == 0, timeout=90, what="every item to be settled")
    stop(procs)

    keys = dict(QueueItem.objects.values_list("id", "group_key"))
    runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for item_id, started in ExecutionLog.objects.values_list("item_id", "executed_at"):
        # Each handler runs at least `asleep` seconds after it logs its start, all of it under its lease.
        runs[keys[item_id]].append((started.timestamp(), started.timestamp() + asleep * 0.95))
    assert {key: len(r) for key, r in runs.items()} == {"a": 6, "b": 6, "c": 6}
    overlaps = {key: max_overlap(r) for key, r in runs.items()}
    assert max(overlaps.values()) == limit, overlaps  # reached, never exceeded


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
