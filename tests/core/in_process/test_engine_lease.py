"""engine.lease: what a lease takes (due, by priority, per ordering key, from unpaused queues) and what it writes
(a reservation per attempt); lease expiry, rescue_expired and release."""

import json
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from queue_app import engine, services
from queue_app.engine import db, sql
from queue_app.engine.lease import _own_transaction
from queue_app.models import DeadLetter, QueueItem, Reservation
from tests.support.prepared_statements import which_ran

LONG = 3600.0  # a retry/lease far beyond any test's duration


def ids(leases) -> list[int]:
    return [h.item_id for h in leases]


def sleep_past(when) -> None:
    """Sleep until a database timestamp has passed, plus a margin (the database runs on this machine's clock)."""
    time.sleep(max(0.0, (when - timezone.now()).total_seconds()) + 0.3)


# -- lease -> reserved --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_lease_reserves_the_item_and_counts_the_attempt():
    queued = engine.enqueue("t", {"x": 1}, max_attempts=3)

    (held,) = engine.lease(["default"], 10, "worker-1", lease_timeout=30)

    item = QueueItem.objects.get(id=queued.id)
    assert item.state == "reserved"
    assert item.attempts == 1
    assert item.reservation_id == held.reservation_id
    assert (held.item_id, held.task, held.payload, held.queue) == (queued.id, "t", {"x": 1}, "default")
    assert (held.attempt, held.max_attempts, held.is_last_attempt) == (1, 3, False)


@pytest.mark.django_db
def test_lease_records_a_reservation_with_worker_and_deadline():
    queued = engine.enqueue("t")

    (held,) = engine.lease(["default"], 1, "worker-1", lease_timeout=30)

    res = Reservation.objects.get(id=held.reservation_id)
    item = QueueItem.objects.get(id=queued.id)
    assert (res.item_id, res.attempt, res.worker_id, res.outcome) == (queued.id, 1, "worker-1", None)
    assert res.lease_expires_at - res.reserved_at == timedelta(seconds=30)
    assert res.lease_expires_at == held.lease_expires_at == item.visible_at
    assert res.heartbeat_at == res.reserved_at
    assert res.finished_at is None


@pytest.mark.django_db
def test_lease_without_timeout_uses_the_queues_lease_timeout():
    engine.enqueue("t", queue="slow")
    services.set_queue_options("slow", lease_timeout=600.0)

    (held,) = engine.lease(["slow"], 1, "w1")

    res = Reservation.objects.get(id=held.reservation_id)
    assert res.lease_expires_at - res.reserved_at == timedelta(seconds=600)


@pytest.mark.django_db
def test_lease_without_timeout_uses_the_items_own_lease_timeout_over_the_queues():
    engine.enqueue("t", queue="slow", lease_timeout=45.0)
    services.set_queue_options("slow", lease_timeout=600.0)

    (held,) = engine.lease(["slow"], 1, "w1")

    res = Reservation.objects.get(id=held.reservation_id)
    assert res.lease_expires_at - res.reserved_at == timedelta(seconds=45)


@pytest.mark.django_db
def test_lease_takes_at_most_n_items():
    engine.enqueue_many("t", [{}] * 5)
    assert len(engine.lease(["default"], 3, "w1")) == 3
    assert len(engine.lease(["default"], 3, "w1")) == 2
    assert engine.lease(["default"], 3, "w1") == []


@pytest.mark.django_db
def test_lease_of_zero_items_takes_nothing():
    engine.enqueue("t")
    assert engine.lease(["default"], 0, "w1") == []
    assert QueueItem.objects.get().state == "ready"


@pytest.mark.django_db
def test_a_reserved_item_is_not_leased_again_before_its_lease_expires():
    engine.enqueue("t")
    engine.lease(["default"], 1, "w1", lease_timeout=LONG)
    assert engine.lease(["default"], 1, "w2") == []
    assert Reservation.objects.count() == 1


@pytest.mark.django_db
def test_lease_only_takes_from_the_named_queues():
    a = engine.enqueue("t", queue="qa")
    engine.enqueue("t", queue="qb")
    assert ids(engine.lease(["qa", "unknown-queue"], 10, "w1")) == [a.id]


@pytest.mark.django_db
def test_lease_of_all_queues_takes_from_every_queue():
    a = engine.enqueue("t", queue="qa")
    b = engine.enqueue("t", queue="qb")
    assert sorted(ids(engine.lease(engine.ALL_QUEUES, 10, "w1"))) == [a.id, b.id]
    assert engine.lease(None, 10, "w1") == []


# -- order: priority, then due time, then id; nothing before it is due ---------------------------------------


@pytest.mark.django_db
def test_higher_priority_is_leased_first():
    low = engine.enqueue("t", priority=-5)
    mid = engine.enqueue("t", priority=0)
    high = engine.enqueue("t", priority=10)
    high2 = engine.enqueue("t", priority=10)

    order = [engine.lease(["default"], 1, "w1")[0].item_id for _ in range(4)]

    assert order == [high.id, high2.id, mid.id, low.id]


@pytest.mark.django_db
def test_a_batch_lease_takes_the_highest_priorities_and_returns_them_best_first():
    low = [engine.enqueue("t", priority=-1).id for _ in range(3)]
    high = [engine.enqueue("t", priority=50).id for _ in range(3)]
    assert ids(engine.lease(["default"], 3, "w1")) == high
    assert ids(engine.lease(["default"], 3, "w1")) == low


@pytest.mark.django_db
def test_same_priority_is_leased_in_due_order_then_id_order():
    later = engine.enqueue("t")
    earliest = engine.enqueue("t", run_at=timezone.now() - timedelta(hours=2))
    earlier = engine.enqueue("t", run_at=timezone.now() - timedelta(hours=1))
    order = [engine.lease(["default"], 1, "w1")[0].item_id for _ in range(3)]
    assert order == [earliest.id, earlier.id, later.id]


@pytest.mark.django_db
def test_item_with_delay_is_not_leased_before_it_is_due():
    engine.enqueue("t", delay=LONG)
    assert engine.lease(["default"], 10, "w1") == []
    assert QueueItem.objects.get().state == "ready"


@pytest.mark.django_db
def test_item_with_future_run_at_is_not_leased_before_it_is_due():
    engine.enqueue("t", run_at=timezone.now() + timedelta(hours=1))
    assert engine.lease(["default"], 10, "w1") == []


@pytest.mark.django_db(transaction=True)
def test_delayed_item_is_leased_once_due():
    queued = engine.enqueue("t", delay=1.0)
    assert engine.lease(["default"], 1, "w1") == []

    sleep_past(QueueItem.objects.get(id=queued.id).run_at)

    assert ids(engine.lease(["default"], 1, "w1")) == [queued.id]


# -- ordering keys ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_items_of_an_ordering_key_are_leased_one_at_a_time_in_enqueue_order():
    a = [engine.enqueue("t", {"n": n}, ordering_key="A").id for n in range(3)]
    free = engine.enqueue("t").id

    assert sorted(ids(engine.lease(["default"], 10, "w1"))) == [a[0], free]
    assert engine.lease(["default"], 10, "w1") == []


@pytest.mark.django_db
def test_next_item_of_a_key_is_leased_after_the_previous_one_is_done():
    a = [engine.enqueue("t", ordering_key="A").id for _ in range(3)]
    order = []
    while held := engine.lease(["default"], 10, "w1"):
        assert len(held) == 1
        order.append(held[0].item_id)
        engine.complete(held[0])
    assert order == a


@pytest.mark.django_db
def test_different_ordering_keys_are_leased_in_parallel():
    a1 = engine.enqueue("t", ordering_key="A").id
    engine.enqueue("t", ordering_key="A")
    b1 = engine.enqueue("t", ordering_key="B").id
    assert sorted(ids(engine.lease(["default"], 10, "w1"))) == [a1, b1]


@pytest.mark.django_db
def test_ordering_keys_are_per_queue():
    a = engine.enqueue("t", ordering_key="A", queue="qa").id
    b = engine.enqueue("t", ordering_key="A", queue="qb").id
    assert sorted(ids(engine.lease(["qa", "qb"], 10, "w1"))) == [a, b]


@pytest.mark.django_db
def test_priority_does_not_jump_the_order_of_a_key():
    first = engine.enqueue("t", ordering_key="A", priority=0).id
    engine.enqueue("t", ordering_key="A", priority=100)
    assert ids(engine.lease(["default"], 10, "w1")) == [first]


@pytest.mark.django_db(transaction=True)
def test_retried_head_item_blocks_its_key_while_in_backoff():
    head = engine.enqueue("t", ordering_key="A").id
    engine.enqueue("t", ordering_key="A")
    other = engine.enqueue("t", ordering_key="B").id
    held = {h.item_id: h for h in engine.lease(["default"], 10, "w1")}
    assert set(held) == {head, other}

    assert engine.fail(held[head], "boom", retry_in=LONG) == "retry"
    engine.complete(held[other])

    assert engine.lease(["default"], 10, "w1") == []  # A2 waits behind A1's retry
    services.retry_now([head])
    assert ids(engine.lease(["default"], 10, "w1")) == [head]  # the retried head keeps its place


@pytest.mark.django_db
def test_dead_head_item_unblocks_its_key():
    head = engine.enqueue("t", ordering_key="A", max_attempts=1).id
    second = engine.enqueue("t", ordering_key="A").id
    (held,) = engine.lease(["default"], 10, "w1")
    assert held.item_id == head

    assert engine.fail(held, "boom") == "dead"

    assert ids(engine.lease(["default"], 10, "w1")) == [second]


@pytest.mark.django_db
def test_cancelled_head_item_unblocks_its_key():
    head = engine.enqueue("t", ordering_key="A").id
    second = engine.enqueue("t", ordering_key="A").id
    services.cancel_items([head])
    assert ids(engine.lease(["default"], 10, "w1")) == [second]


# -- lease expiry, rescue, release --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_expired_lease_is_leased_again_as_a_new_attempt():
    queued = engine.enqueue("t", max_attempts=3)
    (first,) = engine.lease(["default"], 1, "w1", lease_timeout=0.2)
    time.sleep(0.6)

    (second,) = engine.lease(["default"], 1, "w2", lease_timeout=LONG)

    assert second.item_id == queued.id
    assert second.reservation_id != first.reservation_id
    assert second.attempt == 2
    old = Reservation.objects.get(id=first.reservation_id)
    assert (old.outcome, old.worker_id) == ("expired", "w1")
    assert old.finished_at is not None
    item = QueueItem.objects.get(id=queued.id)
    assert (item.state, item.attempts, item.reservation_id) == ("reserved", 2, second.reservation_id)


@pytest.mark.django_db(transaction=True)
def test_expired_lease_on_the_last_attempt_is_not_leased_again():
    engine.enqueue("t", max_attempts=1)
    engine.lease(["default"], 1, "w1", lease_timeout=0.2)
    time.sleep(0.6)
    assert engine.lease(["default"], 1, "w2") == []


@pytest.mark.django_db(transaction=True)
def test_rescue_expired_returns_an_expired_item_to_ready_with_its_attempt_counted():
    queued = engine.enqueue("t", max_attempts=3)
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=0.2)
    time.sleep(0.6)

    assert engine.rescue_expired() == (1, 0)

    item = QueueItem.objects.get(id=queued.id)
    assert (item.state, item.attempts) == ("ready", 1)
    assert "lease expired" in item.error
    assert Reservation.objects.get(id=held.reservation_id).outcome == "expired"
    (again,) = engine.lease(["default"], 1, "w2")
    assert again.attempt == 2


@pytest.mark.django_db(transaction=True)
def test_rescue_expired_on_the_last_attempt_makes_a_dead_letter():
    queued = engine.enqueue("t", max_attempts=1)
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=0.2)
    time.sleep(0.6)

    assert engine.rescue_expired() == (0, 1)

    item = QueueItem.objects.get(id=queued.id)
    assert item.state == "dead"
    assert item.finished_at is not None
    letter = DeadLetter.objects.get(item_id=queued.id)
    assert letter.reason == "lease expired on the last attempt"
    assert Reservation.objects.get(id=held.reservation_id).outcome == "expired"


@pytest.mark.django_db(transaction=True)
def test_rescue_expired_leaves_live_leases_alone():
    live = engine.enqueue("t").id
    engine.lease(["default"], 1, "w1", lease_timeout=LONG)
    assert engine.rescue_expired() == (0, 0)
    assert QueueItem.objects.get(id=live).state == "reserved"


@pytest.mark.django_db(transaction=True)
def test_extended_lease_does_not_expire():
    engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=0.3)
    engine.extend(held, LONG)
    time.sleep(0.8)
    assert engine.lease(["default"], 1, "w2") == []
    assert engine.rescue_expired() == (0, 0)
    engine.complete(held)


@pytest.mark.django_db
def test_release_returns_the_item_to_ready_without_spending_the_attempt():
    queued = engine.enqueue("t", max_attempts=1)
    (held,) = engine.lease(["default"], 1, "w1")

    engine.release(held)

    item = QueueItem.objects.get(id=queued.id)
    assert (item.state, item.attempts) == ("ready", 0)
    assert Reservation.objects.get(id=held.reservation_id).outcome == "released"
    (again,) = engine.lease(["default"], 1, "w2")
    assert (again.item_id, again.attempt, again.is_last_attempt) == (queued.id, 1, True)


@pytest.mark.django_db
def test_release_with_delay_hides_the_item_for_that_long():
    queued = engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1")

    engine.release(held, delay=90)

    item = QueueItem.objects.get(id=queued.id)
    assert item.visible_at - item.updated_at == timedelta(seconds=90)
    assert engine.lease(["default"], 1, "w1") == []


@pytest.mark.django_db
def test_a_lease_across_queues_takes_the_best_items_of_all_of_them():
    engine.enqueue_many("t", [{}] * 3, queue="qa", priority=0)
    high = engine.enqueue_many("t", [{}] * 2, queue="qb", priority=9)

    held = engine.lease(["qa", "qb"], 3, "w1")

    assert [h.item_id for h in held[:2]] == high
    assert [h.queue for h in held] == ["qb", "qb", "qa"]


def plan_nodes(node: dict) -> list[dict]:
    return [node, *(n for child in node.get("Plans", []) for n in plan_nodes(child))]


@pytest.mark.django_db
def test_lease_walks_the_fetch_index_in_order_instead_of_sorting_the_backlog():
    # With a backlog, the fetch must be an ordered scan of the partial index item_fetch that stops after n rows
    # (not a scan and sort of every due row per lease, which also made PostgreSQL JIT-compile each lease).
    engine.enqueue_many("t", [{"n": n} for n in range(20_000)], queue="qa")
    engine.enqueue_many("t", [{"n": n} for n in range(2_000)], queue="qb")
    with connection.cursor() as cur:
        cur.execute("ANALYZE queue_app_queueitem")
        params = {"queues": ["qa", "qb"], "n": 100, "worker_id": "w1", "lease_timeout": None}
        params.update(term_tasks=["t"], term_leases=[30.0], term_floors=[5.0])
        cur.execute("EXPLAIN (FORMAT JSON) " + sql.LEASE, params)
        (explained,) = cur.fetchone()
    explained = json.loads(explained) if isinstance(explained, str) else explained

    nodes = plan_nodes(explained[0]["Plan"])
    item_scans = [n for n in nodes if n.get("Relation Name") == "queue_app_queueitem" and "Scan" in n["Node Type"]]
    fetch = [n for n in item_scans if n.get("Index Name") == "item_fetch"]
    assert [n["Node Type"] for n in fetch] == ["Index Scan"]
    assert "Seq Scan" not in [n["Node Type"] for n in item_scans]
    assert "JIT" not in explained[0]


def _worker_row(worker_id: str, *, silent_for: float) -> None:
    from queue_app.models import Worker

    now = timezone.now()
    Worker.objects.create(
        id=worker_id, host="h", pid=1, started_at=now, last_heartbeat=now - timedelta(seconds=silent_for)
    )


@pytest.mark.django_db(transaction=True)
def test_rescue_takes_back_leases_of_a_worker_silent_past_the_cutoff_and_leaves_live_ones():
    silent, live = (engine.enqueue("t", {"n": n}, lease_timeout=3600).id for n in range(2))
    _worker_row("silent", silent_for=120)
    _worker_row("live", silent_for=1)
    held_silent = engine.lease(None, 1, "silent")
    held_live = engine.lease(None, 1, "live")
    assert {h.item_id for h in held_silent + held_live} == {silent, live}
    assert engine.rescue_expired(lost_after=60) == (1, 0)
    lost = held_silent[0].item_id
    assert QueueItem.objects.get(id=lost).state == "ready"
    assert Reservation.objects.get(id=held_silent[0].reservation_id).outcome == "expired"
    assert QueueItem.objects.get(id=held_live[0].item_id).state == "reserved"
    with pytest.raises(engine.StaleReservation):
        engine.complete(held_silent[0])
    engine.complete(held_live[0])


# -- settle_and_lease: the worker's one round trip ----------------------------------------------------------


@pytest.mark.django_db
def test_settle_and_lease_completes_the_finished_and_leases_the_next_in_one_call():
    engine.enqueue_many("t", [{"n": n} for n in range(4)])
    a, b = engine.lease(["default"], 2, "w1", lease_timeout=LONG)
    engine.fail(b, "boom", retry_in=LONG)  # b's reservation is over: completing it is stale

    out = engine.settle_and_lease([(a, {"r": "a"}), (b, None)], ["default"], 5, "w1", LONG)

    assert out.stale == [b]
    assert len(out.leases) == 2 and {h.item_id for h in out.leases}.isdisjoint({a.item_id, b.item_id})
    item_a = QueueItem.objects.get(id=a.item_id)
    assert (item_a.state, item_a.result) == ("done", {"r": "a"})
    assert Reservation.objects.get(id=a.reservation_id).outcome == "done"
    assert QueueItem.objects.get(id=b.item_id).state == "ready"  # the stale complete changed nothing


def _which_ran(call) -> list[str]:
    return which_ran(call, ("LEASE_OPEN", "SETTLE_AND_LEASE"))


@pytest.mark.django_db
def test_a_lease_with_nothing_to_settle_runs_the_statement_without_the_completes_parts():
    engine.enqueue_many("t", [{}] * 3)
    engine.enqueue_many("t", [{}] * 2, queue="limited")
    services.set_queue_options("limited", concurrency_limit=1)

    first: list = []
    assert _which_ran(lambda: first.extend(engine.lease(None, 5, "w1", LONG))) == ["LEASE_OPEN"]
    # Its 'm' row names the limited queues as the settling statement's does: the call leased the limited queue
    # under its limit after it
    assert sorted(h.queue for h in first) == ["default", "default", "default", "limited"]

    out: list = []
    done = [(h, None) for h in first]
    assert _which_ran(lambda: out.append(engine.settle_and_lease(done, None, 3, "w1", LONG))) == ["SETTLE_AND_LEASE"]
    assert out[0].stale == [] and [h.queue for h in out[0].leases] == ["limited"]  # the settle freed its slot
    assert QueueItem.objects.filter(state="done").count() == 4


@pytest.mark.django_db(transaction=True)
def test_an_item_completed_by_its_expired_lease_is_not_leased_again_by_the_same_statement():
    # The lease half must not pick a row the settle half updates (one statement cannot update a row twice).
    engine.enqueue("t", {})
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=0.05)
    sleep_past(held.lease_expires_at)

    out = engine.settle_and_lease([(held, None)], ["default"], 5, "w1")

    assert (out.stale, out.leases) == ([], [])
    assert QueueItem.objects.get(id=held.item_id).state == "done"
    assert list(Reservation.objects.filter(item_id=held.item_id).values_list("outcome", flat=True)) == ["done"]


@pytest.mark.django_db
def test_task_terms_set_each_lease_to_its_tasks_lease_never_under_its_floor():
    engine.enqueue("slow", {}, lease_timeout=5)
    engine.enqueue("short", {}, lease_timeout=5)
    engine.enqueue("other", {}, lease_timeout=5)
    terms = {"slow": (600.0, 32.0), "short": (1.0, 40.0)}

    leases = {h.task: h for h in engine.lease(["default"], 3, "w1", terms=terms)}

    now = timezone.now()
    seconds = {task: (h.lease_expires_at - now).total_seconds() for task, h in leases.items()}
    assert 590 < seconds["slow"] <= 600  # the task's lease over the item's
    assert 35 < seconds["short"] <= 40  # never under the task's floor (hard timeout + margin)
    assert 0 < seconds["other"] <= 5  # a task without terms keeps the item's


@pytest.mark.django_db
@pytest.mark.parametrize("prepared", [True, False])
def test_task_terms_reach_the_lease_whatever_the_names_and_however_the_statement_is_bound(prepared, monkeypatch):
    """The terms go as arrays dumped once (engine/db.py: text_array, float8_array): quoting survives names that
    an array literal must escape, a task without a lease of its own keeps NULL, and Django's client-side cursor
    (prepared statements off: behind a pooler) binds the same arrays as literals."""
    monkeypatch.setattr(db, "prepared", lambda: prepared)
    names = ['we"ird\\task', "with,comma", "{braces}", "NULL", " spaced "]
    for name in [*names, "no_lease"]:
        engine.enqueue(name, {}, lease_timeout=5)
    terms = {name: (100.0 + 10 * n, 1.0) for n, name in enumerate(names)} | {"no_lease": (None, 30.0)}

    leases = engine.lease(["default"], 10, "w1", terms=terms)

    now = timezone.now()
    seconds = {h.task: (h.lease_expires_at - now).total_seconds() for h in leases}
    assert seconds.keys() == terms.keys()
    for n, name in enumerate(names):
        assert 100 + 10 * n - 5 < seconds[name] <= 100 + 10 * n, (name, seconds)
    assert 25 < seconds["no_lease"] <= 30  # the item's 5 s, raised to the task's floor


def _settle_and_lease_params(relaxed: bool) -> dict:
    return {
        "relaxed_commit": relaxed, "worker_id": "w1", "lease_timeout": LONG, "n": 1, "all_queues": True,
        "queues": [], "term_tasks": [], "term_leases": [], "term_floors": [], "item_ids": [],
        "reservation_ids": [], "results": [],
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("statement", ["SETTLE_AND_LEASE", "LEASE_OPEN"])
@pytest.mark.parametrize("relaxed, during, after", [(True, "off", "on"), (False, "on", "on")])
def test_a_relaxed_settle_and_lease_turns_synchronous_commit_off_for_its_own_transaction_only(
    statement, relaxed, during, after
):
    engine.enqueue("t")
    conn = engine.dedicated_connection()
    try:
        conn.execute("SET synchronous_commit = on")
        with conn.transaction():
            rows = conn.execute(getattr(sql, statement), _settle_and_lease_params(relaxed)).fetchall()
            assert [row[0] for row in rows] == ["m", "l"]  # the 'm' row is still there, and the lease
            assert conn.execute("SELECT current_setting('synchronous_commit')").fetchone()[0] == during
        assert conn.execute("SELECT current_setting('synchronous_commit')").fetchone()[0] == after
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_lease_inside_the_callers_transaction_leaves_its_commit_synchronous():
    engine.enqueue("t")
    assert _own_transaction("default")  # autocommit: the worker's case, relaxed
    with transaction.atomic():
        assert not _own_transaction("default")
        (held,) = engine.lease(["default"], 1, "w1", LONG)
        with connection.cursor() as cur:
            cur.execute("SELECT current_setting('synchronous_commit')")
            assert cur.fetchone()[0] == "on"  # the caller's other writes keep their durability
    assert QueueItem.objects.get(id=held.item_id).state == "reserved"


@pytest.mark.django_db
def test_settle_and_lease_leases_a_limited_queue_within_its_limit():
    engine.enqueue_many("t", [{}] * 5, queue="limited")
    services.set_queue_options("limited", concurrency_limit=2)
    engine.enqueue_many("t", [{}] * 3, queue="open")

    out = engine.settle_and_lease([], None, 10, "w1", LONG)

    assert sorted(h.queue for h in out.leases) == ["limited", "limited", "open", "open", "open"]


@pytest.mark.django_db
def test_settle_and_lease_probes_items_by_primary_key_and_walks_the_fetch_index():
    engine.enqueue_many("t", [{"n": n} for n in range(20_000)], queue="qa")
    done = [(h, None) for h in engine.lease(["qa"], 100, "w1", LONG)]
    with connection.cursor() as cur:
        cur.execute("ANALYZE queue_app_queueitem")
        params = {
            "queues": ["qa"], "all_queues": False, "n": 100, "worker_id": "w1", "lease_timeout": None,
            "relaxed_commit": True,
            "term_tasks": ["t"], "term_leases": [30.0], "term_floors": [5.0],
            "item_ids": [h.item_id for h, _ in done], "reservation_ids": [h.reservation_id for h, _ in done],
            "results": [None] * len(done),
        }  # fmt: skip
        cur.execute("EXPLAIN (FORMAT JSON) " + sql.SETTLE_AND_LEASE, params)
        (explained,) = cur.fetchone()
    explained = json.loads(explained) if isinstance(explained, str) else explained

    item_scans = [
        n
        for n in plan_nodes(explained[0]["Plan"])
        if n.get("Relation Name") == "queue_app_queueitem" and "Scan" in n["Node Type"]
    ]
    assert "Seq Scan" not in [n["Node Type"] for n in item_scans]  # history is never read
    assert "item_fetch" in [n.get("Index Name") for n in item_scans]
