"""Flow control in the lease: a queue's rate limit (leases per window), its group limit (items of one group key in
flight), fair leasing across group keys, and the options' validation. In-process leasers on a real database;
tests/core/processes/test_flow_control_workers.py proves the same with several real worker processes."""

import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from queue_app import engine, services
from queue_app.models import Queue, QueueItem

LONG = 3600.0
transactional = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_table_statistics():
    """Leave the statistics of empty tables behind (they are not rolled back or flushed, and the plan tests after
    these plan on them), as the other tests with big queues do."""
    yield
    with connection.cursor() as cur:
        cur.execute("TRUNCATE queue_app_queueitem, queue_app_reservation CASCADE")
        cur.execute("ANALYZE queue_app_queueitem")
        cur.execute("ANALYZE queue_app_reservation")


def lease(queue: str, n: int = 100, worker: str = "w1") -> list[engine.Lease]:
    return engine.lease([queue], n, worker, lease_timeout=LONG)


def groups_of(leases: list[engine.Lease]) -> Counter:
    keys = dict(QueueItem.objects.filter(id__in=[h.item_id for h in leases]).values_list("id", "group_key"))
    return Counter(keys[h.item_id] for h in leases)


def until_next_window(period: int) -> None:
    """Sleep until just after the database clock enters a new rate window of `period` seconds."""
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp())")
        now = float(cur.fetchone()[0])
    time.sleep(period - now % period + 0.05)


# -- rate limit -----------------------------------------------------------------------------------------------


@transactional
def test_rate_limit_caps_leases_per_window_across_leasers():
    engine.enqueue_many("t", [{}] * 50, queue="api")
    services.set_queue_options("api", rate_limit=7, rate_period=2)
    until_next_window(2)

    first = lease("api", 5, "w1")
    second = lease("api", 5, "w2")
    third = lease("api", 5, "w3")

    assert (len(first), len(second), len(third)) == (5, 2, 0)


@transactional
def test_rate_limit_counts_again_in_the_next_window():
    engine.enqueue_many("t", [{}] * 50, queue="api")
    services.set_queue_options("api", rate_limit=3, rate_period=1)
    until_next_window(1)
    assert len(lease("api")) == 3
    assert lease("api") == []

    until_next_window(1)

    assert len(lease("api")) == 3


def with_room_in_window(period: int, room: float) -> None:
    """Sleep, if need be, until the database clock's rate window of `period` seconds has `room` seconds left."""
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp())")
        left = period - float(cur.fetchone()[0]) % period
    if left < room:
        time.sleep(left + 0.05)


@transactional
def test_completed_items_do_not_give_back_rate_room():
    engine.enqueue_many("t", [{}] * 10, queue="api")
    services.set_queue_options("api", rate_limit=2, rate_period=3600)
    # The leases below all fall in one window: an hour's window has 30 s left but in its last 30 s (a 60 s window
    # made this test sleep 15 s on average).
    with_room_in_window(3600, room=30)
    held = lease("api")
    assert len(held) == 2
    for h in held:
        engine.complete(h)

    assert lease("api") == []
    assert Queue.objects.get(name="api").rate_window_count == 2  # both spent in that one window


@transactional
def test_rate_limit_and_concurrency_limit_both_hold():
    engine.enqueue_many("t", [{}] * 10, queue="api")
    services.set_queue_options("api", rate_limit=5, rate_period=60, concurrency_limit=2)

    assert len(lease("api")) == 2


@transactional
def test_changing_the_rate_limit_starts_a_new_count():
    engine.enqueue_many("t", [{}] * 10, queue="api")
    services.set_queue_options("api", rate_limit=1, rate_period=3600)
    assert len(lease("api")) == 1
    assert lease("api") == []

    services.set_queue_options("api", rate_limit=3, rate_period=3600)

    assert len(lease("api")) == 3


@transactional
def test_a_rate_limited_queue_does_not_hold_back_other_queues():
    engine.enqueue_many("t", [{}] * 5, queue="api")
    engine.enqueue_many("t", [{}] * 5, queue="free")
    services.set_queue_options("api", rate_limit=1, rate_period=3600)

    held = engine.lease(["api", "free"], 10, "w1", lease_timeout=LONG)

    assert Counter(h.queue for h in held) == {"free": 5, "api": 1}


# -- group limit and fairness ---------------------------------------------------------------------------------


@transactional
def test_group_limit_caps_each_keys_items_in_flight():
    for key in ("a", "b"):
        engine.enqueue_many("t", [{}] * 5, queue="tenants", group_key=key)
    services.set_queue_options("tenants", group_concurrency=2)

    first = lease("tenants")
    assert groups_of(first) == {"a": 2, "b": 2}
    assert lease("tenants") == []

    engine.complete(first[0])

    assert groups_of(lease("tenants")) == {groups_of(first[:1]).most_common(1)[0][0]: 1}


@transactional
def test_group_limit_does_not_count_expired_leases():
    engine.enqueue_many("t", [{}] * 3, queue="tenants", group_key="a")
    services.set_queue_options("tenants", group_concurrency=1)
    assert len(engine.lease(["tenants"], 10, "w1", lease_timeout=0.2)) == 1
    time.sleep(0.5)

    assert len(lease("tenants")) == 1


@transactional
def test_fair_lease_takes_group_keys_in_turn():
    engine.enqueue_many("t", [{}] * 1_000, queue="tenants", group_key="big")
    small = engine.enqueue_many("t", [{}] * 10, queue="tenants", group_key="small")
    services.set_queue_options("tenants", fair=True)

    first, second = lease("tenants", 10), lease("tenants", 10)

    assert groups_of(first) == {"big": 5, "small": 5}
    assert groups_of(second) == {"big": 5, "small": 5}
    assert QueueItem.objects.filter(id__in=small, state="reserved").count() == 10


@transactional
def test_fair_lease_fills_the_batch_from_the_keys_that_have_items():
    engine.enqueue_many("t", [{}] * 100, queue="tenants", group_key="big")
    engine.enqueue_many("t", [{}] * 2, queue="tenants", group_key="small")
    services.set_queue_options("tenants", fair=True)

    assert groups_of(lease("tenants", 10)) == {"big": 8, "small": 2}


@transactional
def test_weights_give_a_key_more_turns():
    engine.enqueue_many("t", [{}] * 100, queue="tenants", group_key="gold")
    engine.enqueue_many("t", [{}] * 100, queue="tenants", group_key="basic")
    services.set_queue_options("tenants", fair=True, group_weights={"gold": 3})

    assert groups_of(lease("tenants", 12)) == {"gold": 9, "basic": 3}


@transactional
def test_priority_wins_over_fairness():
    engine.enqueue_many("t", [{}] * 20, queue="tenants", group_key="big", priority=5)
    engine.enqueue_many("t", [{}] * 20, queue="tenants", group_key="small")
    services.set_queue_options("tenants", fair=True)

    assert groups_of(lease("tenants", 10)) == {"big": 10}


@transactional
def test_priority_wins_over_fairness_among_many_keys():
    for key in range(10):
        engine.enqueue_many("t", [{}] * 20, queue="tenants", group_key=f"k{key}")
    urgent = engine.enqueue_many("t", [{}] * 20, queue="tenants", group_key="k3", priority=5)
    services.set_queue_options("tenants", fair=True)

    first = lease("tenants", 15)

    assert {h.item_id for h in first} <= set(urgent) and len(first) == 15


@transactional
def test_a_fair_lease_reads_each_key_up_to_its_share_and_still_fills_the_batch():
    for key in range(20):
        engine.enqueue_many("t", [{}] * 30, queue="tenants", group_key=f"k{key:02}")
    services.set_queue_options("tenants", fair=True)

    assert groups_of(lease("tenants", 40)) == {f"k{key:02}": 2 for key in range(20)}


@transactional
def test_items_without_a_group_key_share_one_group_in_a_fair_queue():
    before = engine.enqueue_many("t", [{}] * 3, queue="tenants")  # queued before the queue was fair
    services.set_queue_options("tenants", fair=True)
    after = engine.enqueue("t", queue="tenants").id
    engine.enqueue_many("t", [{}] * 10, queue="tenants", group_key="a")

    assert set(QueueItem.objects.filter(id__in=[*before, after]).values_list("group_key", flat=True)) == {""}
    assert groups_of(lease("tenants", 8)) == {"": 4, "a": 4}


@transactional
def test_a_requeued_item_without_a_key_is_leased_in_a_fair_queue():
    queued = engine.enqueue("t", queue="tenants", max_attempts=1)
    (held,) = lease("tenants")
    engine.fail(held, "boom", retry_in=0)
    services.set_queue_options("tenants", group_concurrency=1)
    QueueItem.objects.filter(id=queued.id).update(group_key=None)  # finished before the queue had groups

    services.requeue_items([queued.id])

    assert [h.item_id for h in lease("tenants")] == [queued.id]


@transactional
def test_fair_lease_keeps_ordering_keys_one_at_a_time():
    engine.enqueue_many("t", [{}] * 3, queue="tenants", group_key="a", ordering_key="o")
    services.set_queue_options("tenants", fair=True)

    assert len(lease("tenants")) == 1


@transactional
def test_fair_lease_takes_expired_leases_again():
    engine.enqueue("t", queue="tenants", group_key="a")
    services.set_queue_options("tenants", fair=True)
    (first,) = engine.lease(["tenants"], 10, "w1", lease_timeout=0.2)
    time.sleep(0.5)

    (again,) = lease("tenants")

    assert (again.item_id, again.attempt) == (first.item_id, 2)
    with pytest.raises(engine.StaleReservation):
        engine.complete(first)


@transactional
def test_a_paused_fair_queue_leases_nothing():
    engine.enqueue_many("t", [{}] * 3, queue="tenants", group_key="a")
    services.set_queue_options("tenants", fair=True)
    services.pause_queue("tenants")

    assert lease("tenants") == []


# -- options and bad input ------------------------------------------------------------------------------------

BAD = {
    "rate-zero": ({"rate_limit": 0, "rate_period": 60}, "rate_limit must be an integer >= 1"),
    "rate-negative": ({"rate_limit": -5, "rate_period": 60}, "rate_limit must be an integer >= 1"),
    "period-zero": ({"rate_limit": 5, "rate_period": 0}, "rate_period must be an integer number of seconds"),
    "period-alone": ({"rate_period": 60}, "rate_limit must be given with the other"),
    "rate-alone": ({"rate_limit": 60}, "rate_period must be given with the other"),
    "group-zero": ({"group_concurrency": 0}, "group_concurrency must be an integer >= 1"),
    "group-negative": ({"group_concurrency": -1}, "group_concurrency must be an integer >= 1"),
    "group-float": ({"group_concurrency": 1.5}, "group_concurrency must be an integer >= 1"),
    "fair-string": ({"fair": "yes"}, "fair must be true or false"),
    "weight-zero": ({"group_weights": {"a": 0}}, "group_weights must be an object"),
    "weight-key-long": ({"group_weights": {"k" * 201: 1}}, "group_weights must be an object"),
    "weights-list": ({"group_weights": [1, 2]}, "group_weights must be an object"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("options", "message"), BAD.values(), ids=BAD.keys())
def test_bad_flow_options_are_refused_and_nothing_is_written(options, message):
    engine.ensure_queue("api")
    stored = Queue.objects.values().get(name="api")

    with pytest.raises(ValueError, match=message):
        services.set_queue_options("api", **options)
    with pytest.raises(ValueError, match=message):
        services.configure_queue("new-queue", **options)

    assert Queue.objects.values().get(name="api") == stored
    assert not Queue.objects.filter(name="new-queue").exists()


@pytest.mark.django_db
def test_configure_queue_creates_a_queue_with_its_options():
    assert services.configure_queue("api", rate_limit=100, rate_period=60) == (True, 1)
    assert services.configure_queue("api", group_concurrency=2) == (False, 1)

    queue = Queue.objects.get(name="api")
    assert (queue.rate_limit, queue.rate_period, queue.group_concurrency) == (100, 60, 2)
    assert queue.retention == timedelta(days=7)


@pytest.mark.django_db
def test_configure_queue_refuses_a_bad_queue_name():
    with pytest.raises(ValueError, match="queue name must match"):
        services.configure_queue("bad name!", rate_limit=1, rate_period=1)
    assert not Queue.objects.exists()


@pytest.mark.django_db
def test_a_group_key_over_the_size_limit_is_refused_and_nothing_is_written():
    for enqueue in (engine.enqueue, engine.enqueue_many):
        with pytest.raises(engine.InvalidEnqueue, match="group_key must be a non-empty UTF-8 string of at most 200"):
            enqueue("t", *([[{}]] if enqueue is engine.enqueue_many else []), group_key="k" * 201)
    with pytest.raises(engine.InvalidEnqueue, match="group_key must be"):
        engine.enqueue("t", group_key="")
    assert not QueueItem.objects.exists()


# -- the group key through the task APIs ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_registered_task_and_a_django_task_carry_their_group_key():
    from queue_app.registry import get_task
    from tests.tasks import django_tasks_app

    job_item = get_task("queue_app.noop").enqueue({}, group_key="customer-1").id
    many = get_task("queue_app.noop").enqueue_many([{}] * 2, group_key="customer-2")
    django_item = int(django_tasks_app.add.using(group_key="customer-3").enqueue(1, 2).id)

    keys = dict(QueueItem.objects.values_list("id", "group_key"))
    assert [keys[job_item], keys[many[0]], keys[many[1]], keys[django_item]] == [
        "customer-1",
        "customer-2",
        "customer-2",
        "customer-3",
    ]


@pytest.mark.django_db
def test_a_django_task_with_an_oversized_group_key_is_refused():
    from tests.tasks import django_tasks_app

    with pytest.raises(engine.InvalidEnqueue, match="group_key must be"):
        django_tasks_app.add.using(group_key="k" * 201).enqueue(1, 2)
    assert not QueueItem.objects.exists()


@transactional
def test_turning_groups_on_waits_for_an_enqueue_that_read_the_queue_ungrouped():
    import threading

    from queue_app.conf import queue_settings
    from queue_app.engine import sql
    from tests.support.queue_helpers import lock_waiters, raw_connection
    from tests.support.waiting import wait_for

    engine.ensure_queue("tenants")
    params = {
        "queue": "tenants", "task": "t", "payload": "{}", "priority": 0, "run_at": None, "delay": 0.0,
        "ordering_key": None, "group_key": None, "max_attempts": None, "lease_timeout": None,
        "channel": queue_settings.NOTIFY_CHANNEL, "queue_lease_timeout": 60.0, "queue_max_attempts": 5,
        "queue_retention": timedelta(days=7),
    }  # fmt: skip
    with raw_connection() as enqueuer:
        (item_id,) = enqueuer.execute(sql.ENQUEUE, params).fetchone()[:1]  # read the queue ungrouped, not committed
        changer = threading.Thread(target=lambda: services.set_queue_options("tenants", fair=True))
        changer.start()
        wait_for(lambda: lock_waiters('SELECT "queue_app_queue"') == 1, timeout=10, what="the change to wait")
        enqueuer.commit()
        changer.join(10)

    assert QueueItem.objects.get(id=item_id).group_key == ""
    assert [h.item_id for h in lease("tenants")] == [item_id]
