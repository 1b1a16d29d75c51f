"""engine.enqueue / enqueue_many: what gets written, what is refused (and then nothing is written), dedup,
and enqueue joining the caller's transaction (rows and NOTIFY only on commit)."""

import math
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.models import DeadLetter, DedupClaim, Queue, QueueItem, Reservation
from tests.support.queue_helpers import nested


def table_counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in (Queue, QueueItem, Reservation, DeadLetter, DedupClaim)}


def listener() -> psycopg.Connection:
    """A separate connection LISTENing on the queue's channel, as a worker would."""
    conn = engine.dedicated_connection()  # the backend's parameters: they carry the embedded socket directory
    conn.execute(f"LISTEN {queue_settings.NOTIFY_CHANNEL}")
    return conn


def sleep_past(when) -> None:
    """Sleep until a database timestamp has passed, plus a margin (the database runs on this machine's clock)."""
    time.sleep(max(0.0, (when - timezone.now()).total_seconds()) + 0.3)


# -- what enqueue writes ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_creates_a_ready_item_with_its_payload():
    queued = engine.enqueue("billing.charge", {"order": 42, "tags": ["a", "b"]}, priority=7)

    item = QueueItem.objects.get(id=queued.id)
    assert queued.duplicate is False
    assert (queued.queue, queued.task) == ("default", "billing.charge")
    assert item.state == "ready"
    assert item.task == "billing.charge"
    assert item.payload == {"order": 42, "tags": ["a", "b"]}
    assert item.priority == 7
    assert item.attempts == 0
    assert item.reservation_id is None
    assert item.visible_at == item.run_at == queued.run_at
    assert item.finished_at is None


@pytest.mark.django_db
def test_enqueue_creates_its_queue_with_defaults_on_first_use():
    assert not Queue.objects.filter(name="fresh").exists()

    queued = engine.enqueue("t", queue="fresh")

    q = Queue.objects.get(name="fresh")
    assert (q.paused, q.concurrency_limit) == (False, None)
    assert q.max_attempts == queue_settings.DEFAULT_MAX_ATTEMPTS
    assert q.lease_timeout == queue_settings.DEFAULT_LEASE_TIMEOUT
    assert QueueItem.objects.get(id=queued.id).max_attempts == q.max_attempts


@pytest.mark.django_db
def test_enqueue_without_payload_stores_an_empty_object():
    queued = engine.enqueue("t")
    assert QueueItem.objects.get(id=queued.id).payload == {}


@pytest.mark.django_db
def test_enqueue_delay_holds_the_item_back_until_its_due_time():
    queued = engine.enqueue("t", delay=timedelta(minutes=5))
    item = QueueItem.objects.get(id=queued.id)
    assert item.run_at - item.created_at == timedelta(minutes=5)
    assert engine.lease(["default"], 10, "w1") == []  # not before its time
    QueueItem.objects.filter(id=queued.id).update(visible_at=item.created_at)  # five minutes later, in effect
    assert [held.item_id for held in engine.lease(["default"], 10, "w1")] == [queued.id]


@pytest.mark.django_db
def test_enqueue_run_at_in_the_future_is_not_leased_before_then():
    when = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    queued = engine.enqueue("t", run_at=when)
    now = engine.enqueue("t")
    assert QueueItem.objects.get(id=queued.id).run_at == when
    assert [held.item_id for held in engine.lease(["default"], 10, "w1")] == [now.id]


@pytest.mark.django_db
def test_per_item_options_govern_the_item_not_the_queues_defaults():
    """max_attempts, lease_timeout and ordering_key given at enqueue are what the engine then applies."""
    queued = engine.enqueue("t", max_attempts=2, lease_timeout=12.5, ordering_key="cust-1")
    engine.enqueue("t", ordering_key="cust-1")
    (held,) = engine.lease(["default"], 10, "w1")  # the key's second item waits for the first
    assert held.item_id == queued.id
    lease = Reservation.objects.get(id=held.reservation_id)
    assert (lease.lease_expires_at - lease.reserved_at).total_seconds() == pytest.approx(12.5, abs=0.01)
    assert engine.fail(held, "boom", retry_in=0) == "retry"
    (again,) = engine.lease(["default"], 10, "w1")
    assert again.item_id == queued.id  # a retried item keeps its place in its key's line
    assert engine.fail(again, "boom", retry_in=0) == "dead"  # its 2 attempts, not the queue's 5


@pytest.mark.django_db
def test_payload_survives_a_round_trip_through_lease_unchanged():
    payload = {"text": "zé 中文 🎉", "n": 2**62, "f": 1.5, "none": None, "list": [True, False, {"x": []}]}
    engine.enqueue("t", payload)
    (held,) = engine.lease(["default"], 1, "w1")
    assert held.payload == payload


@pytest.mark.django_db
def test_payload_with_a_literal_backslash_u0000_text_is_accepted():
    # The six characters \u0000 (an escaped-looking string) are ordinary text, not a NUL character.
    payload = {"s": "C:\\u0000dir", "t": "\\\\u0000"}
    queued = engine.enqueue("t", payload)
    assert QueueItem.objects.get(id=queued.id).payload == payload


# -- refused input: a clear error, and nothing written ------------------------------------------------------

NOW = datetime(2030, 1, 1, tzinfo=UTC)

BAD_ENQUEUES = {
    "payload-object": (dict(payload=object()), "not JSON-serializable"),
    "payload-set": (dict(payload={1, 2}), "not JSON-serializable"),
    "payload-tuple-key": (dict(payload={(1, 2): "x"}), "not JSON-serializable"),
    "payload-nan": (dict(payload={"x": math.nan}), "JSON cannot carry"),
    "payload-inf": (dict(payload=[1, math.inf]), "JSON cannot carry"),
    "payload-minus-inf": (dict(payload=-math.inf), "JSON cannot carry"),
    "payload-too-deep": (dict(payload=nested(65)), "nested deeper than 64"),
    "payload-lone-surrogate": (dict(payload="\ud800"), "UTF-8"),
    "payload-lone-surrogate-key": (dict(payload={"\udfff": 1}), "UTF-8"),
    "payload-nul": (dict(payload={"s": "a\x00b"}), "NUL"),
    "payload-nul-key": (dict(payload={"a\x00": 1}), "NUL"),
    "negative-delay": (dict(delay=-1), "delay"),
    "negative-timedelta-delay": (dict(delay=timedelta(seconds=-5)), "delay"),
    "nan-delay": (dict(delay=math.nan), "delay"),
    "run_at-and-delay": (dict(run_at=NOW, delay=5), "not both"),
    "naive-run_at": (dict(run_at=datetime(2030, 1, 1)), "timezone-aware"),
    "run_at-not-a-datetime": (dict(run_at="2030-01-01T00:00:00Z"), "timezone-aware"),
    "priority-101": (dict(priority=101), "priority"),
    "priority-minus-101": (dict(priority=-101), "priority"),
    "priority-bool": (dict(priority=True), "priority"),
    "priority-float": (dict(priority=1.5), "priority"),
    "queue-with-space": (dict(queue="bad queue"), "queue name"),
    "queue-empty": (dict(queue=""), "queue name"),
    "queue-too-long": (dict(queue="q" * 101), "queue name"),
    "task-empty": (dict(task=""), "task"),
    "task-not-a-string": (dict(task=None), "task"),
    "task-lone-surrogate": (dict(task="t\ud800"), "task"),
    "max_attempts-zero": (dict(max_attempts=0), "max_attempts"),
    "max_attempts-float": (dict(max_attempts=2.0), "max_attempts"),
    "lease_timeout-zero": (dict(lease_timeout=0), "lease_timeout"),
    "dedup_key-empty": (dict(dedup_key=""), "dedup_key"),
    "dedup_key-lone-surrogate": (dict(dedup_key="k\ud800"), "dedup_key"),
    "dedup_window-negative": (dict(dedup_key="k", dedup_window=-1), "dedup_window"),
    "ordering_key-nul": (dict(ordering_key="a\x00"), "ordering_key"),
    "ordering_key-too-long": (dict(ordering_key="k" * 201), "ordering_key"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("kwargs, message", BAD_ENQUEUES.values(), ids=BAD_ENQUEUES.keys())
def test_bad_enqueue_is_refused_with_a_clear_error_and_writes_nothing(kwargs, message):
    kwargs = {"task": "t", "queue": "fresh", **kwargs}
    before = table_counts()

    with pytest.raises(engine.InvalidEnqueue, match=message):
        engine.enqueue(kwargs.pop("task"), **kwargs)

    assert table_counts() == before


@pytest.mark.django_db
def test_payload_over_max_payload_bytes_is_refused():
    before = table_counts()
    with override_settings(JOBSITE={"MAX_PAYLOAD_BYTES": 1000}):
        engine.enqueue("t", {"s": "x" * 900}, queue="fresh")  # just under: fine
        with pytest.raises(engine.InvalidEnqueue, match="over the limit of 1000"):
            engine.enqueue("t", {"s": "x" * 1000}, queue="fresh")
    assert table_counts()["QueueItem"] == before["QueueItem"] + 1


@pytest.mark.django_db
def test_payload_size_limit_counts_utf8_bytes_not_characters():
    with (
        override_settings(JOBSITE={"MAX_PAYLOAD_BYTES": 1000}),
        pytest.raises(engine.InvalidEnqueue, match="over the limit"),
    ):
        engine.enqueue("t", "é" * 600)  # 600 characters, 1,202 bytes as JSON text
    assert QueueItem.objects.count() == 0


@pytest.mark.django_db
def test_payload_at_max_depth_is_accepted():
    queued = engine.enqueue("t", nested(64))
    assert QueueItem.objects.get(id=queued.id).payload == nested(64)


@pytest.mark.django_db
def test_enqueue_with_unknown_keyword_raises_type_error_and_writes_nothing():
    before = table_counts()
    with pytest.raises(TypeError):
        engine.enqueue("t", {}, priorty=5)
    assert table_counts() == before


# -- enqueue_many -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_many_returns_ids_in_payload_order():
    payloads = [{"n": n} for n in range(250)]

    ids = engine.enqueue_many("bulk.task", payloads, queue="bulk", priority=3, max_attempts=2)

    assert len(ids) == 250
    assert ids == sorted(ids)
    rows = {i.id: i for i in QueueItem.objects.filter(queue_id="bulk")}
    assert set(rows) == set(ids)
    for item_id, payload in zip(ids, payloads, strict=True):
        item = rows[item_id]
        assert item.payload == payload
        assert (item.task, item.state, item.priority, item.attempts, item.max_attempts) == (
            "bulk.task",
            "ready",
            3,
            0,
            2,
        )
        assert item.visible_at == item.run_at


@pytest.mark.django_db
def test_enqueue_many_items_take_the_queue_max_attempts_by_default():
    ids = engine.enqueue_many("t", [{}, {}])
    assert set(QueueItem.objects.filter(id__in=ids).values_list("max_attempts", flat=True)) == {
        queue_settings.DEFAULT_MAX_ATTEMPTS
    }


@pytest.mark.django_db
def test_enqueue_many_items_are_leasable():
    ids = engine.enqueue_many("t", [{"n": n} for n in range(5)])
    held = engine.lease(["default"], 10, "w1")
    assert [h.item_id for h in held] == ids
    assert [h.payload for h in held] == [{"n": n} for n in range(5)]


@pytest.mark.django_db
def test_enqueue_many_with_delay_is_not_due_yet():
    ids = engine.enqueue_many("t", [{}, {}], delay=60)
    assert engine.lease(["default"], 10, "w1") == []
    item = QueueItem.objects.get(id=ids[0])
    assert item.run_at - item.created_at == timedelta(seconds=60)


@pytest.mark.django_db
def test_enqueue_many_validates_every_payload_before_writing_any():
    payloads = [{"n": n} for n in range(1000)]
    payloads[998] = {"bad": object()}
    before = table_counts()

    with pytest.raises(engine.InvalidEnqueue, match="not JSON-serializable"):
        engine.enqueue_many("t", payloads, queue="fresh")

    assert table_counts() == before


@pytest.mark.django_db
def test_enqueue_many_refuses_bad_options_and_writes_nothing():
    before = table_counts()
    with pytest.raises(engine.InvalidEnqueue, match="priority"):
        engine.enqueue_many("t", [{}], priority=500)
    assert table_counts() == before


@pytest.mark.django_db
def test_enqueue_many_of_nothing_writes_nothing():
    before = table_counts()
    assert engine.enqueue_many("t", [], queue="fresh") == []
    assert table_counts() == before


# -- dedup --------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_second_enqueue_of_a_dedup_key_returns_the_first_item_as_duplicate():
    first = engine.enqueue("t", {"v": 1}, dedup_key="order-42")
    second = engine.enqueue("t", {"v": 2}, dedup_key="order-42")

    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.id == first.id
    assert second.run_at == first.run_at
    assert QueueItem.objects.count() == 1
    assert QueueItem.objects.get().payload == {"v": 1}


@pytest.mark.django_db
def test_duplicate_enqueue_does_not_resurrect_a_finished_item():
    first = engine.enqueue("t", dedup_key="k")
    (held,) = engine.lease(["default"], 1, "w1")
    engine.complete(held)
    again = engine.enqueue("t", dedup_key="k")
    assert (again.id, again.duplicate) == (first.id, True)
    assert QueueItem.objects.get(id=first.id).state == "done"


@pytest.mark.django_db
def test_dedup_keys_are_per_queue():
    a = engine.enqueue("t", dedup_key="k", queue="qa")
    b = engine.enqueue("t", dedup_key="k", queue="qb")
    assert a.id != b.id
    assert (a.duplicate, b.duplicate) == (False, False)


@pytest.mark.django_db
def test_enqueue_without_dedup_key_is_not_idempotent():
    a = engine.enqueue("t", {"same": True})
    b = engine.enqueue("t", {"same": True})
    assert a.id != b.id
    assert QueueItem.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_dedup_key_is_free_again_after_its_window():
    window = 1.0
    first = engine.enqueue("t", dedup_key="k", dedup_window=window)
    assert engine.enqueue("t", dedup_key="k", dedup_window=window).duplicate is True

    sleep_past(DedupClaim.objects.get(key="k").expires_at)
    later = engine.enqueue("t", dedup_key="k", dedup_window=window)

    assert later.duplicate is False
    assert later.id != first.id
    assert DedupClaim.objects.get(key="k").item_id == later.id
    assert engine.enqueue("t", dedup_key="k", dedup_window=window).id == later.id  # a new window began


@pytest.mark.django_db(transaction=True)
def test_rolled_back_dedup_enqueue_leaves_no_claim():
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = engine.enqueue("t", dedup_key="k")
        raise RuntimeError("caller fails after enqueue")

    assert DedupClaim.objects.count() == 0
    later = engine.enqueue("t", dedup_key="k")
    assert later.duplicate is False
    assert later.id != rolled_back.id
    assert list(QueueItem.objects.values_list("id", flat=True)) == [later.id]


# -- transactional enqueue ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_rolled_back_transaction_writes_nothing():
    before = table_counts()
    with pytest.raises(RuntimeError), transaction.atomic():
        engine.enqueue("t", {"x": 1}, queue="brand-new")
        engine.enqueue_many("t", [{}, {}], queue="brand-new")
        raise RuntimeError("caller fails after enqueue")

    assert table_counts() == before
    assert not Queue.objects.filter(name="brand-new").exists()
    # ...and the engine does not believe the rolled-back queue exists: the next enqueue creates it.
    queued = engine.enqueue("t", queue="brand-new")
    assert QueueItem.objects.get(id=queued.id).queue_id == "brand-new"


@pytest.mark.django_db(transaction=True)
def test_enqueue_commits_with_the_callers_transaction():
    with transaction.atomic():
        queued = engine.enqueue("t", {"x": 1})
        ids = engine.enqueue_many("t", [{}, {}])
    assert set(QueueItem.objects.values_list("id", flat=True)) == {queued.id, *ids}


@pytest.mark.django_db(transaction=True)
def test_notify_is_not_sent_for_a_rolled_back_enqueue():
    with listener() as conn:
        with pytest.raises(RuntimeError), transaction.atomic():
            engine.enqueue("t", queue="noisy")
            raise RuntimeError
        assert list(conn.notifies(timeout=0.5, stop_after=1)) == []


@pytest.mark.django_db(transaction=True)
def test_notify_is_delivered_on_commit_only():
    with listener() as conn:
        with transaction.atomic():
            engine.enqueue("t", queue="noisy")
            engine.enqueue("t", queue="noisy")
            assert list(conn.notifies(timeout=0.5, stop_after=1)) == []  # not before commit

        got = list(conn.notifies(timeout=5, stop_after=1))
        assert [(n.channel, n.payload) for n in got] == [(queue_settings.NOTIFY_CHANNEL, "noisy")]
        # Repeats within one transaction are folded into one wake-up.
        assert list(conn.notifies(timeout=0.3, stop_after=1)) == []


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_notifies_its_queue_on_commit():
    with listener() as conn:
        engine.enqueue_many("t", [{}, {}, {}], queue="bulk")
        got = list(conn.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in got] == ["bulk"]


@pytest.mark.django_db(transaction=True)
def test_duplicate_enqueue_does_not_notify():
    engine.enqueue("t", dedup_key="k", queue="noisy")
    with listener() as conn:
        assert engine.enqueue("t", dedup_key="k", queue="noisy").duplicate
        assert list(conn.notifies(timeout=0.5, stop_after=1)) == []
