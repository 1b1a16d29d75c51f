"""Hand-off (engine/handoff.py, sql.ENQUEUE_HANDOFF): a plain enqueue in a transaction of its own takes a live idle
worker's offer and writes its item already leased to it, notifying the worker's channel with the lease; every
other enqueue, and every enqueue when no live offer fits, queues its item ready as before. The worker here is a
connection that holds the offer lock and listens, as the worker's listening connection does."""

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.engine import handoff, sql
from queue_app.engine.enqueue import _params as enqueue_params
from queue_app.models import HandoffOffer, QueueItem, Reservation
from queue_app.worker.listener import Listener
from tests.support.prepared_statements import plans_on_a_projects_connection
from tests.support.queue_helpers import lock_waiters, raw_connection
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Worker:
    """A listening session holding an offer lock: what a worker's listening connection does."""

    def __init__(self, worker_id: str = "w-1") -> None:
        self.worker_id = worker_id
        self.conn = raw_connection()
        self.conn.autocommit = True
        self.lock_key, self.channel = handoff.new_key()
        handoff.hold_lock(self.conn, self.lock_key)
        self.conn.execute(f'LISTEN "{self.channel}"')

    def offer(self, queues=("q",), terms=None) -> int:
        """Offer a slot, and have this process know of offers for `queues` (as its enqueue of them would have
        learnt: the statement choice's own tests are below)."""
        for queue in queues:
            handoff.saw(queue, True)
        return handoff.offer(self.conn, self.worker_id, self.channel, self.lock_key, list(queues), terms)

    def notes(self, timeout: float = 2.0) -> list:
        return [handoff.lease_from_note(n.payload) for n in self.conn.notifies(timeout=timeout, stop_after=1)]


@pytest.fixture
def listening() -> Iterator[Worker]:
    engine.ensure_queue("q")
    handoff._offers_seen.clear()
    w = Worker()
    yield w
    w.conn.close()
    handoff._offers_seen.clear()


def statement_params() -> dict:
    """sql.ENQUEUE_HANDOFF's parameters for a plain item of task t into queue q, as engine.enqueue binds them."""
    params = enqueue_params("t", queue="q", priority=0, run_at=None, delay=None, ordering_key=None, group_key=None,
                            max_attempts=None, lease_timeout=None)  # fmt: skip
    return {**params, "payload": "{}"}


def state(item_id: int) -> str:
    return QueueItem.objects.get(id=item_id).state


def test_an_enqueue_takes_a_live_offer_and_the_worker_gets_the_lease(listening):
    offer_id = listening.offer(terms={"t": (12.0, 3.0)})

    item = engine.enqueue("t", {"n": 1}, queue="q", priority=5)

    [(taken, lease)] = listening.notes()
    row = QueueItem.objects.get(id=item.id)
    reservation = Reservation.objects.get(item_id=item.id)
    assert taken == offer_id and not HandoffOffer.objects.exists()
    assert (row.state, row.attempts, row.reservation_id) == ("reserved", 1, reservation.id)
    assert (reservation.worker_id, reservation.attempt, reservation.reserved_at) == ("w-1", 1, row.created_at)
    assert row.visible_at - row.created_at == timedelta(seconds=12)  # the task's term, as a lease would give
    assert lease == engine.Lease(
        reservation.id,
        item.id,
        "q",
        "t",
        {"n": 1},
        1,
        row.max_attempts,
        row.visible_at,
        5,
        None,
        row.run_at,
        row.created_at,
    )
    # The lease is fenced like any other: its complete takes, a second one finds it stale.
    assert engine.complete(lease) is None
    assert state(item.id) == "done"


@pytest.fixture
def backlog_statistics() -> Iterator[None]:
    """The item table's statistics say 20,000 items are ready in another queue. Statistics are not rolled back:
    the table's are those of an empty one again afterwards."""
    engine.enqueue_many("t", [{}] * 20_000, queue="backlog")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_app_queueitem")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM queue_app_queueitem")
        cursor.execute("ANALYZE queue_app_queueitem")


def test_a_projects_connection_plans_the_hand_off_once_on_a_backlogs_statistics(listening, backlog_statistics):
    """With the statistics of a backlog, the check for a due item, when it was a NOT EXISTS, made the generic
    plan cost a read of an average queue's open items, and the enqueue taking an offer was planned anew on every
    call on a project's connection (0.35 ms of a 1.2 ms statement): ('auto', 0, 8) here."""

    def enqueue_eight() -> None:
        for n in range(8):
            listening.offer()
            item = engine.enqueue("t", {"n": n}, queue="q")
            assert [lease.item_id for _, lease in listening.notes()] == [item.id]

    plans = plans_on_a_projects_connection(enqueue_eight, ["ENQUEUE_HANDOFF"])

    assert plans == {"ENQUEUE_HANDOFF": ("auto", 3, 5)}  # planned with the values five times, then kept generic


def test_without_a_term_the_lease_lasts_the_items_then_the_queues(listening):
    listening.offer()
    own = engine.enqueue("t", queue="q", lease_timeout=7)
    listening.notes()
    listening.offer()
    plain = engine.enqueue("t", queue="q")
    listening.notes()

    leases = {i.id: i.visible_at - i.created_at for i in QueueItem.objects.all()}
    assert leases[own.id] == timedelta(seconds=7)
    assert leases[plain.id] == timedelta(seconds=queue_settings.DEFAULT_LEASE_TIMEOUT)


def test_an_offer_of_a_session_gone_is_not_taken(listening):
    listening.offer()
    # The worker died: its lock goes with its session once the server process has ended, which a client's close
    # does not wait for. pg_terminate_backend with a timeout returns once it has.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [listening.conn.info.backend_pid])
        assert cursor.fetchone() == (True,)
    listening.conn.close()

    item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready"
    assert HandoffOffer.objects.count() == 1  # left for the next offer to clear
    other = Worker("w-2")
    other.offer()
    assert list(HandoffOffer.objects.values_list("worker_id", flat=True)) == ["w-2"]
    other.conn.close()


@pytest.mark.parametrize(
    "options",
    [
        {"ordering_key": "k"},
        {"group_key": "g"},
        {"delay": 5},
        {"dedup_key": "d"},
        {"debounce_key": "b", "debounce": 1},
        {"payload": {"big": "x" * handoff.PAYLOAD_MAX}},
        {"payload": {"wide": "é" * (handoff.PAYLOAD_MAX // 2)}},  # few characters, too many bytes
        {"payload": [1] * 3_000},  # 6,001 bytes as sent; 9,000 as jsonb renders it, past NOTIFY's 8,000
    ],
    ids=lambda o: next(iter(o)),
)
def test_an_enqueue_that_cannot_be_handed_off_is_queued_ready(listening, options):
    listening.offer()
    payload = options.pop("payload", None)

    item = engine.enqueue("t", payload, queue="q", **options)

    assert state(item.id) == "ready"
    assert HandoffOffer.objects.count() == 1 and listening.notes(timeout=0.2) == []


def test_an_enqueue_in_a_transaction_is_queued_ready(listening):
    listening.offer()

    with transaction.atomic():
        item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready"
    assert HandoffOffer.objects.count() == 1


@pytest.mark.parametrize("change", ["paused", "concurrency_limit", "fair"])
def test_a_paused_or_flow_controlled_queue_is_not_handed_off(listening, change):
    with connection.cursor() as cur:
        value = {"paused": "true", "concurrency_limit": "3", "fair": "true"}[change]
        cur.execute(f"UPDATE queue_app_queue SET {change} = {value} WHERE name = 'q'")
    listening.offer()

    item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready"


def test_an_item_does_not_pass_a_due_item_waiting_in_its_queue(listening):
    waiting = engine.enqueue("t", queue="q")  # no offer yet: queued ready
    listening.offer()

    item = engine.enqueue("t", queue="q")

    assert (state(waiting.id), state(item.id)) == ("ready", "ready")
    assert HandoffOffer.objects.count() == 1


AHEAD, BEHIND = timedelta(hours=1), timedelta(seconds=-1)


@pytest.mark.parametrize(
    ("waiting", "handed"),
    [
        ({"priority": -1}, True),  # a lower priority waits: the item would have been leased first anyway
        ({"visible_at": AHEAD}, True),  # not due yet
        ({"state": "reserved", "attempts": 1, "visible_at": AHEAD}, True),  # in flight
        ({"state": "reserved", "attempts": 1, "visible_at": BEHIND}, False),  # its lease lapsed: due again
        ({"state": "reserved", "attempts": 3, "visible_at": BEHIND}, True),  # lapsed on its last attempt: dead
        ({"priority": 5, "visible_at": BEHIND}, False),  # a higher priority waits
    ],
    ids=["lower_priority", "not_due", "in_flight", "lease_lapsed", "last_attempt_lapsed", "higher_priority"],
)
def test_what_waits_in_the_queue_and_what_does_not(listening, waiting, handed):
    other = engine.enqueue("t", queue="q", max_attempts=3)  # no offer yet: queued ready
    changes = {key: (timezone.now() + value if key == "visible_at" else value) for key, value in waiting.items()}
    QueueItem.objects.filter(id=other.id).update(**changes)
    listening.offer()

    item = engine.enqueue("t", queue="q")

    assert state(item.id) == ("reserved" if handed else "ready")


def test_a_due_item_behind_many_in_flight_of_a_higher_priority_is_not_passed(listening):
    """The check reads every item of the priority and above, not a head of the fetch order: 40 items in flight
    at priority 5 come first in it, and the due item of priority 0 behind them still holds the hand-off."""
    engine.enqueue_many("t", [{}] * 40, queue="q", priority=5)
    QueueItem.objects.filter(queue_id="q").update(state="reserved", attempts=1, visible_at=timezone.now() + AHEAD)
    engine.enqueue("t", queue="q")  # ready and due, behind them
    listening.offer()

    item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready" and HandoffOffer.objects.count() == 1


def test_the_first_enqueue_into_a_new_queue_is_not_handed_off(listening):
    """Its queue is created by the very statement, invisible to its snapshot: it may not be what it will be when
    committed (paused by an admin at the same moment), so the item is queued ready."""
    handoff.offer(listening.conn, "w-1", listening.channel, listening.lock_key, None, None)
    handoff.saw("brand-new", True)

    item = engine.enqueue("t", queue="brand-new")

    assert state(item.id) == "ready"


def test_an_offer_is_taken_only_for_the_queues_it_names(listening):
    engine.ensure_queue("other")
    listening.offer(queues=("other",))
    mine = engine.enqueue("t", queue="q")
    assert state(mine.id) == "ready"

    QueueItem.objects.all().delete()
    HandoffOffer.objects.all().delete()
    handoff.offer(listening.conn, "w-1", listening.channel, listening.lock_key, None, None)  # every queue
    handoff.saw("q", True)
    anywhere = engine.enqueue("t", queue="q")
    assert state(anywhere.id) == "reserved"


def test_the_setting_off_queues_every_item_ready(listening):
    listening.offer()

    with override_settings(JOBSITE={"HANDOFF": False}):
        item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready"


def test_two_enqueues_never_take_one_offer(listening):
    """The first enqueue holds the offer's row (its transaction open); the second passes it (SKIP LOCKED) and
    queues its item ready; the first then commits its hand-off."""
    listening.offer()
    with raw_connection() as first:
        first_id = first.execute(sql.ENQUEUE_HANDOFF, statement_params()).fetchone()[0]  # not committed yet
        second = engine.enqueue("t", queue="q")
        first.commit()

    assert (state(first_id), state(second.id)) == ("reserved", "ready")
    assert [lease.item_id for _, lease in listening.notes()] == [first_id]


def test_a_withdrawal_waits_for_an_enqueue_taking_the_offer_and_finds_it_taken(listening):
    """The enqueue holds the offer (taken, not committed) when the worker withdraws it: the withdrawal waits for
    the enqueue's commit, then finds it taken, and the lease arrives."""
    offer_id = listening.offer()
    withdrawn: list[bool] = []
    with raw_connection() as enqueuer:
        item_id = enqueuer.execute(sql.ENQUEUE_HANDOFF, statement_params()).fetchone()[0]
        thread = threading.Thread(target=lambda: withdrawn.append(handoff.withdraw(listening.conn, offer_id)))
        thread.start()
        wait_for(lambda: lock_waiters(sql.WITHDRAW[:40]) == 1, timeout=10, what="the withdrawal to wait")
        enqueuer.commit()
        thread.join(10)

    assert withdrawn == [False]
    assert [lease.item_id for _, lease in listening.notes()] == [item_id]
    assert state(item_id) == "reserved"


def test_a_withdrawn_offer_is_not_taken(listening):
    offer_id = listening.offer()

    assert handoff.withdraw(listening.conn, offer_id) is True
    item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready"


def test_a_new_offer_replaces_the_workers_earlier_ones(listening):
    listening.offer()
    listening.offer()

    assert HandoffOffer.objects.count() == 1


def test_the_offer_lock_is_the_session_lock_of_the_listening_connection(listening):
    with raw_connection() as other:
        other.autocommit = True
        held = other.execute(
            "SELECT pg_try_advisory_lock_shared(%s, %s)", (sql.HANDOFF_LOCK_NAMESPACE, listening.lock_key)
        ).fetchone()[0]
    assert held is False
    assert listening.channel.startswith(queue_settings.NOTIFY_CHANNEL) and len(listening.channel) <= 63


def test_a_process_tries_an_offer_only_once_it_saw_one(listening):
    """Taking an offer costs more than a plain enqueue when none is there, so a process that saw no offer lately
    sends ENQUEUE with a read of the offer table: that item is queued ready, and the answer has the next enqueue
    take the offer. A statement that finds none sends the process back to the plain one."""
    handoff.offer(listening.conn, "w-1", listening.channel, listening.lock_key, ["q"], None)  # not seen

    first = engine.enqueue("t", queue="q")
    QueueItem.objects.filter(id=first.id).update(state="done")  # run (else the next would not pass it)
    second = engine.enqueue("t", queue="q")

    assert state(second.id) == "reserved"
    assert handoff.statement("q") is sql.ENQUEUE_HANDOFF  # the offer taken was there: still worth a try
    third = engine.enqueue("t", queue="q")  # no offer left: queued ready, and the process stops trying
    assert state(third.id) == "ready" and handoff.statement("q") is sql.ENQUEUE_PROBING


def test_an_offer_seen_long_ago_is_not_tried(listening, monkeypatch):
    listening.offer()
    monkeypatch.setitem(handoff._offers_seen, "q", handoff._offers_seen["q"] - handoff.OFFERS_FRESH - 0.1)

    item = engine.enqueue("t", queue="q")

    assert state(item.id) == "ready"  # probed, not taken
    assert handoff.statement("q") is sql.ENQUEUE_HANDOFF  # and seen again


def test_a_listener_ignores_a_note_on_its_channel_that_carries_no_lease(caplog):
    listener = Listener(["q"], "w-1")
    listener.connect()
    try:
        listener.offer_id = 7  # an offer out, as far as the listener knows
        with raw_connection() as other:
            other.autocommit = True
            other.execute("SELECT pg_notify(%s, %s)", (listener.channel, '{"h": 7}'))
            other.execute("SELECT pg_notify(%s, 'not json')", (listener.channel,))
        wait_for(lambda: listener.drain() is False and len(caplog.records) >= 2, 5, what="the notes drained")
        still = listener.offer_id
    finally:
        listener.close(release=False)
    assert listener.take_handed() == [] and still == 7  # nothing held, the offer not taken for it
    assert all("carries no lease" in r.getMessage() for r in caplog.records)


def test_a_malformed_note_is_refused_loudly():
    with pytest.raises(KeyError):
        handoff.lease_from_note('{"h": 1}')
    with pytest.raises(ValueError):  # not JSON
        handoff.lease_from_note("not json")
