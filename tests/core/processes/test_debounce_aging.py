"""Debounce and priority aging (issue 41): in-process service calls for the semantics and the refusals, then one
real-worker proof per guarantee (1,000 enqueues of one key -> one run with the last payload; a key that never goes
quiet runs at its maximum wait; a low-priority item starts under a steady stream of higher-priority work, passed
only by items due within the aging bound). Assertions are on what the database recorded, not on wall time."""

import io
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import close_old_connections, connection, transaction

from queue_app import engine, services
from queue_app.flow import effective_priority
from queue_app.models import Queue, QueueItem, Reservation, Worker
from tests.support.waiting import wait_for
from tests.support.worker_helpers import finish

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = "queue_app.echo"


@pytest.fixture
def empty_table_statistics():
    """Leave the statistics of empty tables behind, as the other tests with big queues do (the plan tests plan
    on them)."""
    yield
    with connection.cursor() as cur:
        cur.execute("TRUNCATE queue_app_queueitem, queue_app_reservation CASCADE")
        cur.execute("ANALYZE queue_app_queueitem")
        cur.execute("ANALYZE queue_app_reservation")


def debounced(payload, key="k", **options):
    return engine.enqueue(ECHO, payload, queue="deb", debounce_key=key, debounce=options.pop("debounce", 30), **options)


# -- debounce, in process -------------------------------------------------------------------------------------


def test_enqueues_of_a_key_collapse_into_one_ready_item_with_the_latest_payload():
    first = debounced({"n": 1}, debounce_max=60)
    second = debounced({"n": 2})
    third = debounced({"n": 3})
    other = debounced({"n": 9}, key="other")
    assert first.id == second.id == third.id != other.id
    assert (first.absorbed, second.absorbed, third.absorbed) == (0, 1, 2)
    item = QueueItem.objects.get(id=first.id)
    assert item.payload == {"n": 3} and item.absorbed == 2 and item.state == "ready"
    assert third.run_at > first.run_at  # each enqueue pushed the due time back
    assert item.debounce_until == item.created_at + timedelta(seconds=60)
    # A key whose item was leased starts a new item: the one in flight keeps the payload it was leased with.
    lease = engine.lease(["deb"], 10, "w", lease_timeout=30)
    assert lease == []  # not due yet (30 s quiet window)
    QueueItem.objects.filter(id=first.id).update(visible_at=item.created_at, run_at=item.created_at)
    (leased,) = engine.lease(["deb"], 1, "w", lease_timeout=30)
    assert leased.item_id == first.id and leased.payload == {"n": 3}
    after = debounced({"n": 4})
    assert after.id != first.id and after.absorbed == 0
    # The leased item failing back to ready beside the key's new item: both ready, the new one still absorbs.
    engine.fail(leased, "try again", retry_in=0)
    assert debounced({"n": 5}).id == after.id
    assert QueueItem.objects.get(id=first.id).payload == {"n": 3}
    # A cancelled item requeued beside the key's new ready item runs as itself.
    services.cancel_items([after.id])
    newest = debounced({"n": 6})
    assert services.requeue_items([after.id]) == 1
    assert QueueItem.objects.get(id=after.id).debounce_key is None and debounced({"n": 7}).id == newest.id


def test_the_maximum_wait_caps_the_due_time():
    first = debounced({"n": 1}, debounce=5, debounce_max=5)
    time.sleep(0.05)
    again = debounced({"n": 2}, debounce=5, debounce_max=5)
    assert again.id == first.id
    assert again.run_at == first.run_at == QueueItem.objects.get(id=first.id).debounce_until


def test_two_enqueuers_of_one_key_at_once_make_one_item():
    """The first holds its new item uncommitted; the second waits on the unique index, then absorbs into it."""
    holding, release, results = threading.Event(), threading.Event(), []

    def first():
        try:
            with transaction.atomic():
                results.append(debounced({"n": 1}))
                holding.set()
                release.wait(10)
        finally:
            close_old_connections()

    def second():
        try:
            results.append(debounced({"n": 2}))
        finally:
            close_old_connections()

    a = threading.Thread(target=first)
    a.start()
    assert holding.wait(10)
    b = threading.Thread(target=second)
    b.start()
    wait_for(
        lambda: _waiting_on_a_lock(),
        timeout=10,
        what="the second enqueuer waiting on the first's uncommitted item",
    )
    release.set()
    a.join(10)
    b.join(10)
    assert len(results) == 2 and results[0].id == results[1].id and results[1].absorbed == 1
    (item,) = QueueItem.objects.filter(queue_id="deb")
    assert item.payload == {"n": 2} and item.absorbed == 1


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cur.fetchone()[0] > 0


BAD_DEBOUNCE = [
    ({"debounce_key": "k", "debounce": 1, "dedup_key": "d"}, "not both"),
    ({"debounce_key": "k"}, "both debounce_key and debounce"),
    ({"debounce": 1}, "both debounce_key and debounce"),
    ({"debounce_key": "k", "debounce": -1}, "debounce must be"),
    ({"debounce_key": "k", "debounce": 0}, "debounce must be"),
    ({"debounce_key": "k", "debounce": 5, "debounce_max": 1}, "at least debounce"),
    ({"debounce_key": "k", "debounce": 1, "delay": 3}, "not run_at or delay"),
    ({"debounce_key": "", "debounce": 1}, "debounce_key must be"),
]


def test_bad_debounce_is_refused_and_writes_nothing():
    for options, message in BAD_DEBOUNCE:
        with pytest.raises(engine.InvalidEnqueue, match=message):
            engine.enqueue(ECHO, {}, queue="bad-deb", **options)
    assert not QueueItem.objects.filter(queue_id="bad-deb").exists()
    assert not Queue.objects.filter(name="bad-deb").exists()


def test_a_key_held_by_another_task_is_refused():
    debounced({"n": 1})
    with pytest.raises(engine.InvalidEnqueue, match="another task"):
        engine.enqueue("queue_app.noop", {}, queue="deb", debounce_key="k", debounce=30)
    assert QueueItem.objects.filter(queue_id="deb").count() == 1


def command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_cli_debounce_and_queue_stats_absorbed():
    for n in range(3):
        shown = command("enqueue", ECHO, "--payload", json.dumps({"n": n}), "--debounce-key", "k", "--debounce", "30")
    assert "2 enqueues of key 'k' absorbed" in shown
    with pytest.raises(CommandError, match="not both"):
        command("enqueue", ECHO, "--debounce-key", "k", "--debounce", "1", "--dedup-key", "d")
    with pytest.raises(CommandError, match="cannot be combined with --count"):
        command("enqueue", ECHO, "--debounce-key", "k", "--debounce", "1", "--count", "2")
    (queue,) = [q for q in json.loads(command("queue_stats", "--json"))["queues"] if q["queue"] == "default"]
    assert queue["absorbed"] == 2 and queue["ready"] + queue["scheduled"] == 1


# -- aging, in process ----------------------------------------------------------------------------------------


def test_aging_orders_by_due_time_less_priority_over_rate():
    services.configure_queue("aged", aging_rate=10.0)
    high = [engine.enqueue("queue_app.noop", {}, queue="aged", priority=100).id for _ in range(3)]
    low = engine.enqueue("queue_app.noop", {}, queue="aged", priority=-100).id
    # Due 21 s ago: 200 points of gap at 10 points/s is 20 s, so it now ranks above the new high items.
    QueueItem.objects.filter(id=low).update(
        run_at=QueueItem.objects.get(id=low).created_at - timedelta(seconds=21),
        visible_at=QueueItem.objects.get(id=low).created_at - timedelta(seconds=21),
    )
    first = engine.lease(["aged"], 1, "w", lease_timeout=30)
    assert [lease.item_id for lease in first] == [low]
    rest = engine.lease(["aged"], 10, "w", lease_timeout=30)
    assert sorted(lease.item_id for lease in rest) == high
    item = QueueItem.objects.get(id=low)
    assert effective_priority(-100, 10.0, "ready", item.run_at, item.run_at + timedelta(seconds=21)) == 110


def test_aging_off_keeps_priority_order():
    low = engine.enqueue("queue_app.noop", {}, queue="plain", priority=-100).id
    high = engine.enqueue("queue_app.noop", {}, queue="plain", priority=100).id
    assert [lease.item_id for lease in engine.lease(["plain"], 1, "w", lease_timeout=30)] == [high]
    assert [lease.item_id for lease in engine.lease(["plain"], 1, "w", lease_timeout=30)] == [low]


def test_bad_aging_is_refused_and_changes_nothing():
    services.configure_queue("aged", aging_rate=2.0)
    for bad in (-1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="aging_rate must be"):
            services.configure_queue("aged", aging_rate=bad)
    with pytest.raises(ValueError, match="cannot be combined with fair"):
        services.configure_queue("aged", fair=True)
    assert Queue.objects.get(name="aged").aging_rate == 2.0 and not Queue.objects.get(name="aged").fair
    with pytest.raises(CommandError, match="--aging must be"):
        command("queue_config", "aged", "--aging", "-3")
    with pytest.raises(CommandError, match="--aging must be"):
        command("queue_config", "aged", "--aging", "fast")
    assert Queue.objects.get(name="aged").aging_rate == 2.0
    assert json.loads(command("queue_config", "aged", "--aging", "30/1m", "--json"))["aging_rate"] == 0.5
    assert "aging 0.5/s" in command("queue_config", "aged")
    assert "aging" not in command("queue_config", "aged", "--aging", "none")
    assert Queue.objects.get(name="aged").aging_rate is None


# -- real workers -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_a_thousand_enqueues_of_one_key_run_once_with_the_last_payload(worker):
    proc = worker("deb1", "--pool", "thread", "--concurrency", "2", "--queues", "deb")
    wait_for(lambda: Worker.objects.filter(state="running").exists(), timeout=60, what="a running worker")
    for n in range(1000):  # one after another (a few seconds), never quiet for the 2 s window
        debounced({"n": n}, debounce=2)
    wait_for(
        lambda: QueueItem.objects.filter(queue_id="deb", state="done").exists(), timeout=30, what="the debounced run"
    )
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    (item,) = QueueItem.objects.filter(queue_id="deb")
    assert item.result == {"n": 999} and item.absorbed == 999 and item.attempts == 1
    assert Reservation.objects.filter(item_id=item.id).count() == 1


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_a_key_that_never_goes_quiet_runs_at_its_maximum_wait(worker):
    proc = worker("deb2", "--pool", "thread", "--concurrency", "2", "--queues", "deb")
    wait_for(lambda: Worker.objects.filter(state="running").exists(), timeout=60, what="a running worker")
    first = debounced({"n": 0}, debounce=1.0, debounce_max=2.0)
    n = 0

    def first_done() -> bool:
        nonlocal n
        n += 1
        debounced({"n": n}, debounce=1.0, debounce_max=2.0)  # every 50 ms: the key never goes quiet
        return QueueItem.objects.filter(id=first.id, state="done").exists()

    wait_for(first_done, timeout=30, what="the first item run while its key stays busy", interval=0.05)
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    item = QueueItem.objects.get(id=first.id)
    (reservation,) = Reservation.objects.filter(item_id=item.id)
    assert item.run_at == item.debounce_until == item.created_at + timedelta(seconds=2)
    assert reservation.reserved_at >= item.debounce_until
    assert item.absorbed >= 10 and item.result["n"] >= 10
    # The enqueues after its lease started a new item of the key.
    assert QueueItem.objects.filter(queue_id="deb").exclude(id=item.id).exists()


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_a_low_priority_item_starts_under_a_steady_stream_of_higher_priority_work(worker):
    """Aging at 9 points/s: a priority-0 item is passed by no priority-9 item due more than 1 s after it, so it
    starts although the stream of priority-9 work never lets up (without aging it would wait for the stream to
    end)."""
    rate, gap = 9.0, 9
    bound = gap / rate
    services.configure_queue("aged", aging_rate=rate)
    proc = worker("aged1", "--pool", "thread", "--concurrency", "1", "--queues", "aged")
    wait_for(lambda: Worker.objects.filter(state="running").exists(), timeout=60, what="a running worker")
    sleep = engine.enqueue_many
    # A backlog of priority-9 work due before it (about 3 s of it), so the low item is leased well past the bound
    # and the stream's items due after the bound are many by then.
    sleep("queue_app.sleep", [{"seconds": 0.01}] * 300, queue="aged", priority=gap)
    low = engine.enqueue("queue_app.sleep", {"seconds": 0.01}, queue="aged", priority=0).id

    def low_started() -> bool:
        sleep("queue_app.sleep", [{"seconds": 0.01}] * 5, queue="aged", priority=gap)  # about 50 a second
        return Reservation.objects.filter(item_id=low).exists()

    wait_for(low_started, timeout=30, what="the low-priority item leased", interval=0.1)
    for _ in range(10):  # the stream goes on past the bound
        low_started()
        time.sleep(0.1)
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    item = QueueItem.objects.get(id=low)
    reserved_at = Reservation.objects.get(item_id=low).reserved_at
    passed = QueueItem.objects.filter(queue_id="aged", priority=gap, reservation__reserved_at__lt=reserved_at)
    latest_passer = max(passed.values_list("run_at", flat=True))
    # The scene the bound is tested in: the low item was leased past the bound (behind the backlog due before
    # it), so items due after it had the time to pass it ...
    assert reserved_at > item.run_at + timedelta(seconds=bound), (reserved_at, item.run_at)
    # ... and those due within the bound did (the bound is reached, not kept by a stream that never came near it),
    # those due later did not
    assert item.run_at + timedelta(seconds=bound / 4) < latest_passer, (latest_passer, item.run_at)
    assert latest_passer <= item.run_at + timedelta(seconds=bound + 0.01)
    # ... while higher-priority work already due when it was leased still waited behind it (not leased then, or
    # only after it): without aging the low item would have waited for every such item.
    waited = QueueItem.objects.filter(queue_id="aged", priority=gap, run_at__lt=reserved_at).exclude(
        reservation__reserved_at__lte=reserved_at
    )
    assert waited.count() >= 10, waited.count()
