"""services: the state changes outside the hot path (cancel, requeue, retry now, pause/resume, queue options).

These write times with the ORM's Now() (statement time) while the engine compares with now() (transaction
time), so tests that lease after a service call run with real transactions."""

import time
from datetime import timedelta

import pytest

from queue_app import engine, services
from queue_app.models import DeadLetter, Queue, QueueItem, Reservation

LONG = 3600.0
transactional = pytest.mark.django_db(transaction=True)


def lease_ids(queue: str = "default", n: int = 10) -> list[int]:
    return [h.item_id for h in engine.lease([queue], n, "w1", lease_timeout=LONG)]


def kill(max_attempts: int = 1, **options) -> int:
    """An item failed to the dead letters."""
    queued = engine.enqueue("t", max_attempts=max_attempts, **options)
    for _ in range(max_attempts):
        (held,) = engine.lease([queued.queue], 1, "w1")
        engine.fail(held, "boom", retry_in=0)
    assert QueueItem.objects.get(id=queued.id).state == "dead"
    return queued.id


# -- cancel -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_ready_item_makes_it_cancelled():
    item_id = engine.enqueue("t").id

    assert services.cancel_items([item_id], actor="alice") == 1

    item = QueueItem.objects.get(id=item_id)
    assert (item.state, item.error) == ("cancelled", "cancelled by alice")
    assert item.finished_at is not None
    assert engine.lease(["default"], 10, "w1") == []


@pytest.mark.django_db
def test_cancel_reserved_item_ends_its_reservation_as_cancelled():
    engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=LONG)

    assert services.cancel_items([held.item_id]) == 1

    assert QueueItem.objects.get(id=held.item_id).state == "cancelled"
    res = Reservation.objects.get(id=held.reservation_id)
    assert res.outcome == "cancelled"
    assert res.finished_at is not None


@pytest.mark.django_db
@pytest.mark.parametrize("settle", ["complete", "fail", "dead", "extend", "release"])
def test_holder_of_a_cancelled_item_cannot_settle_it(settle):
    engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=LONG)
    services.cancel_items([held.item_id])

    with pytest.raises(engine.StaleReservation):
        {
            "complete": lambda: engine.complete(held, {"late": True}),
            "fail": lambda: engine.fail(held, "late", retry_in=0),
            "dead": lambda: engine.dead(held, "late"),
            "extend": lambda: engine.extend(held, 60),
            "release": lambda: engine.release(held),
        }[settle]()

    item = QueueItem.objects.get(id=held.item_id)
    assert (item.state, item.result) == ("cancelled", None)
    assert Reservation.objects.get(id=held.reservation_id).outcome == "cancelled"
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db
def test_cancel_leaves_finished_items_alone():
    engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1")
    engine.complete(held, {"ok": True})
    dead_id = kill()

    assert services.cancel_items([held.item_id, dead_id, 999_999]) == 0

    assert QueueItem.objects.get(id=held.item_id).state == "done"
    assert QueueItem.objects.get(id=dead_id).state == "dead"


@pytest.mark.django_db
def test_cancel_counts_only_the_items_it_changed():
    ready = engine.enqueue("t").id
    done = engine.enqueue("t", queue="other").id
    (held,) = engine.lease(["other"], 1, "w1")
    engine.complete(held)
    assert services.cancel_items([ready, done]) == 1


# -- requeue ------------------------------------------------------------------------------------------------


@transactional
def test_requeue_dead_item_makes_it_ready_with_attempts_reset():
    item_id = kill(max_attempts=2)

    assert services.requeue_items([item_id], actor="alice") == 1

    item = QueueItem.objects.get(id=item_id)
    assert (item.state, item.attempts, item.error, item.finished_at) == ("ready", 0, "", None)
    (held,) = engine.lease(["default"], 1, "w1")
    assert (held.item_id, held.attempt, held.is_last_attempt) == (item_id, 1, False)


@transactional
def test_requeue_keeps_the_attempt_history():
    item_id = kill(max_attempts=2)
    history = list(Reservation.objects.filter(item_id=item_id).values_list("id", "outcome"))

    services.requeue_items([item_id])
    engine.lease(["default"], 1, "w1")

    now = list(Reservation.objects.filter(item_id=item_id).order_by("id").values_list("id", "outcome"))
    assert now[:2] == sorted(history)
    assert [outcome for _, outcome in now] == ["retry", "dead", None]


@transactional
def test_requeue_marks_the_dead_letter_requeued_by_the_actor():
    item_id = kill()

    services.requeue_items([item_id], actor="alice")

    letter = DeadLetter.objects.get(item_id=item_id)
    assert letter.requeued_by == "alice"
    assert letter.requeued_at is not None


@transactional
def test_requeue_cancelled_item_makes_it_ready():
    item_id = engine.enqueue("t").id
    services.cancel_items([item_id])

    assert services.requeue_items([item_id], actor="bob") == 1

    assert QueueItem.objects.get(id=item_id).state == "ready"
    assert lease_ids() == [item_id]


@transactional
def test_requeued_cancelled_item_is_not_settled_by_its_old_holder():
    engine.enqueue("t")
    (old,) = engine.lease(["default"], 1, "w1", lease_timeout=LONG)
    services.cancel_items([old.item_id])
    services.requeue_items([old.item_id])

    with pytest.raises(engine.StaleReservation):
        engine.complete(old)

    (new,) = engine.lease(["default"], 1, "w2")
    assert new.item_id == old.item_id
    engine.complete(new)


@pytest.mark.django_db
def test_requeue_leaves_ready_reserved_and_done_items_alone():
    ready = engine.enqueue("t").id
    engine.enqueue("t", queue="q2")
    (reserved,) = engine.lease(["q2"], 1, "w1")
    engine.enqueue("t", queue="q3")
    (done,) = engine.lease(["q3"], 1, "w1")
    engine.complete(done)

    assert services.requeue_items([ready, reserved.item_id, done.item_id]) == 0

    states = dict(QueueItem.objects.values_list("id", "state"))
    assert [states[ready], states[reserved.item_id], states[done.item_id]] == ["ready", "reserved", "done"]


@transactional
def test_requeue_dead_letters_requeues_their_items():
    a, b = kill(), kill()
    letters = list(DeadLetter.objects.filter(item_id__in=[a, b]).values_list("id", flat=True))

    assert services.requeue_dead_letters(letters, actor="carol") == 2

    assert set(QueueItem.objects.filter(id__in=[a, b]).values_list("state", flat=True)) == {"ready"}
    assert set(DeadLetter.objects.values_list("requeued_by", flat=True)) == {"carol"}
    assert sorted(lease_ids()) == sorted([a, b])


@transactional
def test_requeue_dead_letters_skips_letters_already_requeued():
    item_id = kill()
    letter = DeadLetter.objects.get(item_id=item_id)
    services.requeue_dead_letters([letter.id], actor="first")

    assert services.requeue_dead_letters([letter.id], actor="second") == 0

    assert DeadLetter.objects.get(id=letter.id).requeued_by == "first"


@transactional
def test_requeued_item_that_dies_again_gets_a_new_dead_letter():
    item_id = kill()
    services.requeue_items([item_id], actor="alice")
    (held,) = engine.lease(["default"], 1, "w1")

    engine.fail(held, "boom again", retry_in=0)

    letters = list(DeadLetter.objects.filter(item_id=item_id).order_by("id"))
    assert [(d.requeued_by, d.requeued_at is None) for d in letters] == [("alice", False), ("", True)]
    assert letters[1].last_error == "boom again"


# -- retry now ----------------------------------------------------------------------------------------------


@transactional
def test_retry_now_makes_an_item_in_backoff_due_at_once():
    engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1")
    engine.fail(held, "boom", retry_in=LONG)
    assert lease_ids() == []

    assert services.retry_now([held.item_id]) == 1

    assert lease_ids() == [held.item_id]


@transactional
def test_retry_now_makes_a_delayed_item_due_at_once():
    item_id = engine.enqueue("t", delay=LONG).id
    assert services.retry_now([item_id]) == 1
    assert lease_ids() == [item_id]


@transactional
def test_retry_now_leaves_due_reserved_and_finished_items_alone():
    dead_id = kill()
    due = engine.enqueue("t").id
    engine.enqueue("t", queue="q2")
    (reserved,) = engine.lease(["q2"], 1, "w1", lease_timeout=LONG)

    assert services.retry_now([due, reserved.item_id, dead_id]) == 0

    assert QueueItem.objects.get(id=reserved.item_id).state == "reserved"
    assert QueueItem.objects.get(id=dead_id).state == "dead"


# -- pause / resume -----------------------------------------------------------------------------------------


@transactional
def test_paused_queue_is_skipped_by_lease():
    paused = engine.enqueue("t", queue="paused").id
    other = engine.enqueue("t", queue="other").id

    assert services.pause_queue("paused") == 1

    assert engine.lease(["paused"], 10, "w1") == []
    assert [h.item_id for h in engine.lease(engine.ALL_QUEUES, 10, "w1")] == [other]
    assert QueueItem.objects.get(id=paused).state == "ready"


@transactional
def test_resumed_queue_is_leased_again():
    item_id = engine.enqueue("t", queue="paused").id
    services.pause_queue("paused")
    assert engine.lease(["paused"], 10, "w1") == []

    assert services.resume_queue("paused") == 1

    assert lease_ids("paused") == [item_id]


@transactional
def test_items_in_flight_finish_normally_while_their_queue_is_paused():
    engine.enqueue("t", queue="paused")
    (held,) = engine.lease(["paused"], 1, "w1")
    services.pause_queue("paused")
    engine.complete(held, {"ok": True})
    assert QueueItem.objects.get(id=held.item_id).state == "done"


@pytest.mark.django_db
def test_pause_and_resume_report_whether_they_changed_anything():
    engine.enqueue("t", queue="q")
    assert services.pause_queue("q") == 1
    assert services.pause_queue("q") == 0
    assert services.resume_queue("q") == 1
    assert services.resume_queue("q") == 0
    assert services.pause_queue("no-such-queue") == 0


# -- queue options ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_concurrency_limit_caps_items_in_flight():
    engine.enqueue_many("t", [{}] * 5, queue="limited")
    services.set_queue_options("limited", concurrency_limit=2)

    first = engine.lease(["limited"], 10, "w1", lease_timeout=LONG)
    assert len(first) == 2
    assert engine.lease(["limited"], 10, "w2", lease_timeout=LONG) == []

    engine.complete(first[0])
    assert len(engine.lease(["limited"], 10, "w2", lease_timeout=LONG)) == 1
    assert QueueItem.objects.filter(queue_id="limited", state="reserved").count() == 2


@pytest.mark.django_db
def test_concurrency_limit_does_not_hold_back_other_queues():
    engine.enqueue_many("t", [{}] * 3, queue="limited")
    engine.enqueue_many("t", [{}] * 3, queue="free")
    services.set_queue_options("limited", concurrency_limit=1)

    held = engine.lease(["limited", "free"], 10, "w1", lease_timeout=LONG)

    assert sorted(h.queue for h in held) == ["free", "free", "free", "limited"]


@transactional
def test_concurrency_limit_does_not_count_expired_leases():
    engine.enqueue_many("t", [{}] * 2, queue="limited")
    services.set_queue_options("limited", concurrency_limit=1)
    (stuck,) = engine.lease(["limited"], 10, "w1", lease_timeout=0.2)
    time.sleep(0.6)

    assert len(engine.lease(["limited"], 10, "w2", lease_timeout=LONG)) == 1


@pytest.mark.django_db
def test_removing_the_concurrency_limit_lifts_the_cap():
    engine.enqueue_many("t", [{}] * 4, queue="limited")
    services.set_queue_options("limited", concurrency_limit=1)
    assert len(engine.lease(["limited"], 10, "w1", lease_timeout=LONG)) == 1

    services.set_queue_options("limited", concurrency_limit=None)

    assert len(engine.lease(["limited"], 10, "w1", lease_timeout=LONG)) == 3


@pytest.mark.django_db
def test_queue_max_attempts_applies_to_items_enqueued_afterwards():
    engine.enqueue("t", queue="q")
    services.set_queue_options("q", max_attempts=2)
    assert QueueItem.objects.get(id=engine.enqueue("t", queue="q").id).max_attempts == 2
    (bulk_id,) = engine.enqueue_many("t", [{}], queue="q")
    assert QueueItem.objects.get(id=bulk_id).max_attempts == 2


@pytest.mark.django_db
def test_set_queue_options_refuses_unknown_options_and_changes_nothing():
    engine.enqueue("t", queue="q")
    before = Queue.objects.get(name="q")
    with pytest.raises(ValueError, match="unknown queue options: paused"):
        services.set_queue_options("q", paused=True, max_attempts=9)
    after = Queue.objects.get(name="q")
    assert (after.paused, after.max_attempts) == (before.paused, before.max_attempts)


# -- purge ----------------------------------------------------------------------------------------------------


@transactional
def test_purge_dead_letters_deletes_only_items_dead_longer_than_asked():
    old = kill()
    QueueItem.objects.filter(id=old).update(finished_at=QueueItem.objects.get(id=old).finished_at - timedelta(days=30))
    recent = kill()

    services.purge_dead_letters(timedelta(days=7))

    assert list(QueueItem.objects.values_list("id", flat=True)) == [recent]
    assert list(DeadLetter.objects.values_list("item_id", flat=True)) == [recent]
    assert not Reservation.objects.filter(item_id=old).exists()
