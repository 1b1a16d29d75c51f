"""Settling a reservation: complete, fail (retry with backoff, or dead), dead (poison), extend; fencing by the
reservation id, so a reservation that is no longer current changes nothing."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.models import DeadLetter, QueueItem, Reservation
from tests.support.prepared_statements import plans_on_a_projects_connection

LONG = 3600.0


def enqueue_and_lease(**options) -> engine.Lease:
    engine.enqueue("t", {"x": 1}, **options)
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=LONG)
    return held


def sleep_past(when) -> None:
    """Sleep until a database timestamp has passed, plus a margin (the database runs on this machine's clock)."""
    time.sleep(max(0.0, (when - timezone.now()).total_seconds()) + 0.3)


def snapshot(item_id: int) -> tuple[dict, list[dict], list[dict]]:
    """Everything a settle could change about one item: its row, its reservations, its dead letters."""
    return (
        QueueItem.objects.filter(id=item_id).values().get(),
        list(Reservation.objects.filter(item_id=item_id).order_by("id").values()),
        list(DeadLetter.objects.filter(item_id=item_id).order_by("id").values()),
    )


# -- complete -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_complete_marks_the_item_done_with_its_result():
    held = enqueue_and_lease()

    engine.complete(held, {"charged": 12.5, "ids": [1, 2]})

    item = QueueItem.objects.get(id=held.item_id)
    assert item.state == "done"
    assert item.result == {"charged": 12.5, "ids": [1, 2]}
    assert item.finished_at is not None
    res = Reservation.objects.get(id=held.reservation_id)
    assert res.outcome == "done"
    assert res.finished_at is not None


def _hot_updates(table: str) -> int:
    """HOT updates of `table` by this transaction so far (pg_stat_get_xact_*: counted before commit)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_get_xact_tuples_hot_updated(%s::regclass)", [table])
        return cur.fetchone()[0]


@pytest.mark.django_db
def test_a_done_settle_rewrites_its_reservations_in_place_and_other_ends_are_stamped():
    """The done settle changes no indexed value of its reservations, so each is a HOT update (a new version on its
    page, no index entries) wherever the page has room: the table's fillfactor leaves about half of each page,
    which holds all but a few of a batch leased together (47 of 50 here). An index on a column the settle writes
    (finished_at, outcome) makes none of them HOT. An attempt that ends otherwise carries its end in not_done_at,
    which the failure counts read."""
    engine.enqueue_many("t", [{"n": n} for n in range(60)])
    held = engine.lease(["default"], 60, "w1", lease_timeout=LONG)
    before = _hot_updates(Reservation._meta.db_table)

    engine.complete_many((h, None) for h in held[:50])

    assert _hot_updates(Reservation._meta.db_table) - before >= 40
    done = Reservation.objects.filter(id__in=[h.reservation_id for h in held[:50]])
    assert {(r.outcome, r.not_done_at) for r in done} == {("done", None)}
    engine.fail(held[50], "boom", retry_in=LONG)
    failed = Reservation.objects.get(id=held[50].reservation_id)
    assert failed.outcome == "retry" and failed.not_done_at == failed.finished_at is not None


@pytest.mark.django_db
def test_complete_without_result_stores_null():
    held = enqueue_and_lease()
    engine.complete(held)
    assert QueueItem.objects.get(id=held.item_id).result is None


@pytest.mark.django_db
def test_done_item_is_not_leased_again():
    held = enqueue_and_lease()
    engine.complete(held)
    assert engine.lease(["default"], 10, "w2") == []


@pytest.mark.django_db
def test_a_complete_repeated_by_its_own_reservation_succeeds_and_changes_nothing():
    # A worker whose complete committed but whose connection dropped before the reply retries it: that retry
    # must succeed (an at-most-once item settled before its run would otherwise never run), and write nothing.
    held = enqueue_and_lease()
    engine.complete(held, {"first": True})
    before = snapshot(held.item_id)

    engine.complete(held, {"second": True})
    assert engine.complete_many([(held, {"third": True})]) == []

    assert snapshot(held.item_id) == before
    assert QueueItem.objects.get(id=held.item_id).result == {"first": True}


@pytest.mark.django_db(transaction=True)  # now() must move on between statements
def test_a_complete_by_an_earlier_reservation_of_a_done_item_is_stale():
    engine.enqueue("t", {"x": 1})
    (first,) = engine.lease(["default"], 1, "w1", lease_timeout=0.05)
    sleep_past(first.lease_expires_at)
    [second] = engine.lease(["default"], 1, "w2")  # the first lease expired: taken again
    engine.complete(second, {"by": "second"})
    before = snapshot(first.item_id)

    with pytest.raises(engine.StaleReservation) as caught:
        engine.complete(first, {"by": "first"})

    assert (caught.value.reservation_id, caught.value.item_id) == (first.reservation_id, first.item_id)
    assert snapshot(first.item_id) == before


@pytest.mark.django_db
@pytest.mark.parametrize("settle", ["fail", "dead", "extend", "release"])
def test_completed_reservation_cannot_be_settled_again(settle):
    held = enqueue_and_lease()
    engine.complete(held)
    before = snapshot(held.item_id)

    with pytest.raises(engine.StaleReservation):
        SETTLES[settle](held)

    assert snapshot(held.item_id) == before


@pytest.mark.django_db
def test_complete_with_a_non_json_result_raises_and_changes_nothing():
    held = enqueue_and_lease()
    before = snapshot(held.item_id)

    with pytest.raises(engine.InvalidEnqueue, match="result is not JSON-serializable"):
        engine.complete(held, {"when": object()})

    assert snapshot(held.item_id) == before
    engine.complete(held, {"ok": True})  # the reservation is still current


@pytest.mark.django_db
def test_complete_many_settles_current_reservations_and_returns_the_stale_ones():
    engine.enqueue_many("t", [{"n": n} for n in range(4)])
    a, b, c, d = engine.lease(["default"], 4, "w1")
    engine.complete(b)  # b is done by this reservation already: completing it again is a no-op, not stale
    engine.fail(d, "boom", retry_in=LONG)  # d's reservation ended otherwise: stale from now on

    stale = engine.complete_many([(a, {"r": "a"}), (b, {"r": "b"}), (c, None), (d, {"r": "d"})])

    assert stale == [d]
    states = dict(QueueItem.objects.values_list("id", "state"))
    assert [states[h.item_id] for h in (a, b, c, d)] == ["done", "done", "done", "ready"]
    assert QueueItem.objects.get(id=a.item_id).result == {"r": "a"}
    assert QueueItem.objects.get(id=b.item_id).result is None  # the repeated settle wrote nothing
    outcomes = dict(Reservation.objects.values_list("id", "outcome"))
    assert [outcomes[h.reservation_id] for h in (a, b, c, d)] == ["done", "done", "done", "retry"]


@pytest.mark.django_db
def test_complete_many_validates_every_result_before_writing():
    engine.enqueue_many("t", [{}, {}])
    a, b = engine.lease(["default"], 2, "w1")
    with pytest.raises(engine.InvalidEnqueue):
        engine.complete_many([(a, {"ok": 1}), (b, {"nan": float("nan")})])
    assert set(QueueItem.objects.values_list("state", flat=True)) == {"reserved"}


@pytest.mark.django_db
def test_complete_many_of_nothing_is_a_no_op():
    assert engine.complete_many([]) == []


# -- fail ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_fail_with_attempts_left_returns_the_item_to_ready_after_a_backoff():
    held = enqueue_and_lease(max_attempts=3)

    assert engine.fail(held, "ValueError: boom", traceback="Traceback ...") == "retry"

    item = QueueItem.objects.get(id=held.item_id)
    assert (item.state, item.attempts, item.error) == ("ready", 1, "ValueError: boom")
    assert item.finished_at is None
    backoff = item.visible_at - item.updated_at
    jitter = queue_settings.BACKOFF_JITTER
    base = timedelta(seconds=queue_settings.BACKOFF_BASE)
    assert base * (1 - jitter) <= backoff <= base * (1 + jitter)
    assert item.run_at == item.visible_at
    res = Reservation.objects.get(id=held.reservation_id)
    assert (res.outcome, res.error, res.traceback) == ("retry", "ValueError: boom", "Traceback ...")
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db
def test_fail_with_retry_in_makes_the_item_due_that_much_later():
    held = enqueue_and_lease()
    engine.fail(held, "rate limited", retry_in=42.5)
    item = QueueItem.objects.get(id=held.item_id)
    assert item.visible_at - item.updated_at == timedelta(seconds=42.5)
    assert engine.lease(["default"], 1, "w1") == []


@pytest.mark.django_db
def test_fail_with_negative_retry_in_retries_at_once():
    held = enqueue_and_lease()
    engine.fail(held, "boom", retry_in=-10)
    item = QueueItem.objects.get(id=held.item_id)
    assert item.visible_at == item.updated_at
    assert [h.item_id for h in engine.lease(["default"], 1, "w1")] == [held.item_id]


@pytest.mark.django_db(transaction=True)
def test_failed_item_is_leased_again_after_its_backoff():
    held = enqueue_and_lease()
    engine.fail(held, "boom", retry_in=1.0)
    assert engine.lease(["default"], 1, "w1") == []

    sleep_past(QueueItem.objects.get(id=held.item_id).visible_at)

    (again,) = engine.lease(["default"], 1, "w1")
    assert (again.item_id, again.attempt) == (held.item_id, 2)


@pytest.mark.django_db
def test_fail_on_the_last_attempt_makes_the_item_a_dead_letter():
    held = enqueue_and_lease(max_attempts=1)

    assert engine.fail(held, "KeyError: 'sku'", traceback="Traceback ...") == "dead"

    item = QueueItem.objects.get(id=held.item_id)
    assert (item.state, item.attempts, item.error) == ("dead", 1, "KeyError: 'sku'")
    assert item.finished_at is not None
    letter = DeadLetter.objects.get(item_id=held.item_id)
    assert (letter.reason, letter.last_error) == ("max attempts exhausted", "KeyError: 'sku'")
    assert letter.requeued_at is None
    res = Reservation.objects.get(id=held.reservation_id)
    assert (res.outcome, res.traceback) == ("dead", "Traceback ...")
    assert engine.lease(["default"], 1, "w1") == []


@pytest.mark.django_db
def test_item_dies_after_exactly_max_attempts_failures():
    engine.enqueue("t", max_attempts=3)
    outcomes = []
    for _ in range(3):
        (held,) = engine.lease(["default"], 1, "w1")
        outcomes.append(engine.fail(held, "boom", retry_in=0))
    assert outcomes == ["retry", "retry", "dead"]
    assert Reservation.objects.count() == 3
    assert list(Reservation.objects.order_by("id").values_list("attempt", flat=True)) == [1, 2, 3]


@pytest.mark.django_db
def test_fail_timed_out_records_the_attempt_as_timed_out():
    held = enqueue_and_lease(max_attempts=2)
    assert engine.fail(held, "hard timeout after 30s", timed_out=True, retry_in=0) == "retry"
    assert Reservation.objects.get(id=held.reservation_id).outcome == "timed_out"
    assert QueueItem.objects.get(id=held.item_id).state == "ready"


@pytest.mark.django_db
def test_fail_stores_error_text_with_nul_and_lone_surrogates_instead_of_crashing():
    held = enqueue_and_lease(max_attempts=2)

    engine.fail(held, "bad byte \x00 and \ud800", traceback="tb \x00", retry_in=0)

    item = QueueItem.objects.get(id=held.item_id)
    assert item.state == "ready"
    assert item.error == "bad byte \\x00 and ?"
    assert Reservation.objects.get(id=held.reservation_id).traceback == "tb \\x00"


# -- dead (poison) ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_dead_sends_the_item_to_the_dead_letters_at_once_with_its_reason():
    held = enqueue_and_lease(max_attempts=5)

    engine.dead(held, "unknown task: t", "no handler registered")

    item = QueueItem.objects.get(id=held.item_id)
    assert (item.state, item.attempts) == ("dead", 1)
    letter = DeadLetter.objects.get(item_id=held.item_id)
    assert (letter.reason, letter.last_error) == ("unknown task: t", "no handler registered")
    assert Reservation.objects.get(id=held.reservation_id).outcome == "dead"


@pytest.mark.django_db
def test_dead_without_error_records_the_reason_as_error():
    held = enqueue_and_lease()
    engine.dead(held, "payload does not match the task's signature")
    assert QueueItem.objects.get(id=held.item_id).error == "payload does not match the task's signature"


@pytest.mark.django_db
def test_dead_truncates_a_long_reason_to_fit():
    held = enqueue_and_lease()
    engine.dead(held, "x" * 500)
    assert DeadLetter.objects.get(item_id=held.item_id).reason == "x" * 200


# -- extend -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_extend_pushes_the_lease_deadline_and_records_a_heartbeat():
    held = enqueue_and_lease()

    deadline = engine.extend(held, 120)

    item = QueueItem.objects.get(id=held.item_id)
    res = Reservation.objects.get(id=held.reservation_id)
    assert item.visible_at == res.lease_expires_at == deadline
    assert deadline - item.updated_at == timedelta(seconds=120)
    assert res.heartbeat_at == item.updated_at


@pytest.mark.django_db
def test_extend_many_returns_deadlines_for_current_reservations_only():
    engine.enqueue_many("t", [{}, {}])
    a, b = engine.lease(["default"], 2, "w1")
    engine.complete(b)
    assert set(engine.extend_many([a, b], 60)) == {a.reservation_id}


@pytest.mark.django_db(transaction=True)
def test_a_projects_connection_plans_one_items_complete_and_extend_once():
    """A transactional handler's complete, a reservation used as a lock, a handler's ctx.extend: one item at a
    time on a project's connection. Through a batch's arrays, whose length a plan made without the values puts
    at 10, the generic plan looked ten times dearer than one item's, and each call was planned anew
    (COMPLETE_MANY ('auto', 0, 8) for eight completes, 0.27 ms of a 0.83 ms call)."""
    engine.enqueue_many("t", [{}] * 8)

    def settle_eight() -> None:
        for held in engine.lease(["default"], 8, "w1", lease_timeout=LONG):
            engine.extend(held, 60)
            engine.complete(held, {"ok": True})

    plans = plans_on_a_projects_connection(settle_eight, ["COMPLETE_ONE", "EXTEND_ONE"])

    assert plans == {"COMPLETE_ONE": ("auto", 3, 5), "EXTEND_ONE": ("auto", 3, 5)}
    assert QueueItem.objects.filter(state="done", result={"ok": True}).count() == 8


# -- fencing: a lease that expired and was taken again ------------------------------------------------------


def _fail(h):
    return engine.fail(h, "late failure", retry_in=0)


SETTLES = {
    "complete": lambda h: engine.complete(h, {"late": True}),
    "fail": _fail,
    "dead": lambda h: engine.dead(h, "late poison"),
    "extend": lambda h: engine.extend(h, LONG),
    "release": lambda h: engine.release(h),
}


@pytest.fixture
def retaken(transactional_db):
    """An item whose first lease (0.2 s) expired and which a second worker then leased: (first, second)."""
    engine.enqueue("t", max_attempts=5)
    (first,) = engine.lease(["default"], 1, "w1", lease_timeout=0.2)
    time.sleep(0.6)
    (second,) = engine.lease(["default"], 1, "w2", lease_timeout=LONG)
    assert second.item_id == first.item_id
    return first, second


@pytest.mark.parametrize("settle", SETTLES)
def test_stale_reservation_cannot_settle(retaken, settle):
    first, second = retaken
    before = snapshot(first.item_id)

    with pytest.raises(engine.StaleReservation) as caught:
        SETTLES[settle](first)

    assert caught.value.reservation_id == first.reservation_id
    assert snapshot(first.item_id) == before


def test_stale_reservation_is_returned_by_complete_many_and_extend_many(retaken):
    first, second = retaken
    before = snapshot(first.item_id)
    assert engine.complete_many([(first, {"late": True})]) == [first]
    assert engine.extend_many([first], LONG) == {}
    assert snapshot(first.item_id) == before


@pytest.mark.parametrize(
    "settle, state, outcome",
    [
        ("complete", "done", "done"),
        ("fail", "ready", "retry"),
        ("dead", "dead", "dead"),
        ("extend", "reserved", None),
        ("release", "ready", "released"),
    ],
)
def test_current_holder_of_a_retaken_item_can_settle(retaken, settle, state, outcome):
    first, second = retaken
    SETTLES[settle](second)
    assert QueueItem.objects.get(id=second.item_id).state == state
    assert Reservation.objects.get(id=second.reservation_id).outcome == outcome


def test_current_holder_of_a_retaken_item_completes_it(retaken):
    first, second = retaken
    engine.complete(second, {"by": "w2"})
    item = QueueItem.objects.get(id=second.item_id)
    assert (item.state, item.result, item.reservation_id) == ("done", {"by": "w2"}, second.reservation_id)
    outcomes = list(Reservation.objects.filter(item_id=item.id).order_by("id").values_list("outcome", flat=True))
    assert outcomes == ["expired", "done"]


@pytest.mark.django_db(transaction=True)
def test_expired_but_not_retaken_reservation_can_still_complete():
    # Fencing is by the current reservation, not the clock: nobody else took the item, so the late worker's
    # result stands (no attempt is wasted).
    engine.enqueue("t")
    (held,) = engine.lease(["default"], 1, "w1", lease_timeout=0.2)
    time.sleep(0.6)
    engine.complete(held, {"late": True})
    assert QueueItem.objects.get(id=held.item_id).state == "done"


# -- backoff policy -----------------------------------------------------------------------------------------


def test_backoff_doubles_with_each_attempt_within_jitter_bounds():
    base, jitter = queue_settings.BACKOFF_BASE, queue_settings.BACKOFF_JITTER
    for attempt in range(1, 12):
        nominal = base * 2 ** (attempt - 1)
        for _ in range(50):
            assert nominal * (1 - jitter) <= engine.backoff_seconds(attempt) <= nominal * (1 + jitter)


def test_backoff_grows_with_the_attempt():
    # With +-20% jitter a doubling always outgrows the jitter: every sample of attempt n+1 beats attempt n.
    for attempt in range(1, 11):
        assert max(engine.backoff_seconds(attempt) for _ in range(30)) < min(
            engine.backoff_seconds(attempt + 1) for _ in range(30)
        )


def test_backoff_is_capped_at_backoff_max():
    cap, jitter = queue_settings.BACKOFF_MAX, queue_settings.BACKOFF_JITTER
    for attempt in (13, 20, 64, 1_000, 100_000):
        samples = [engine.backoff_seconds(attempt) for _ in range(20)]
        assert all(cap * (1 - jitter) <= delay <= cap for delay in samples)
        # Spread at the cap too: a clip to the cap put about half of them on the cap itself.
        assert len(set(samples)) == len(samples), samples


def test_backoff_jitter_spreads_retries():
    assert len({engine.backoff_seconds(3) for _ in range(20)}) > 1


@override_settings(JOBSITE={"BACKOFF_BASE": 2.0, "BACKOFF_MAX": 10.0, "BACKOFF_JITTER": 0.0})
def test_backoff_follows_the_configured_base_and_cap():
    assert [engine.backoff_seconds(a) for a in range(0, 6)] == [2.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert engine.backoff_seconds(3, base=1.0, cap=100.0) == 4.0


@pytest.mark.django_db
@override_settings(JOBSITE={"BACKOFF_BASE": 10.0, "BACKOFF_MAX": 1000.0, "BACKOFF_JITTER": 0.0})
def test_fail_without_retry_in_waits_the_backoff_of_its_attempt():
    engine.enqueue("t", max_attempts=5)
    delays = []
    for _ in range(3):
        (held,) = engine.lease(["default"], 1, "w1")
        engine.fail(held, "boom")
        item = QueueItem.objects.get(id=held.item_id)
        delays.append((item.visible_at - item.updated_at).total_seconds())
        QueueItem.objects.filter(id=item.id).update(visible_at=item.created_at)  # due again now
    assert delays == [10.0, 20.0, 40.0]


@pytest.mark.django_db
@override_settings(JOBSITE={"BACKOFF_BASE": 1.0, "BACKOFF_MAX": 3600.0, "BACKOFF_JITTER": 0.2})
def test_a_retry_past_the_cap_waits_at_most_the_cap_jitter_included():
    """The README says "capped at an hour": the cap holds after the jitter, not before it (a retry waited ~72 min)."""
    engine.enqueue("t", max_attempts=30)
    delays = []
    for _ in range(20):  # attempts 1..20: base * 2^19 is far past the hour
        (held,) = engine.lease(["default"], 1, "w1")
        engine.fail(held, "boom")
        item = QueueItem.objects.get(id=held.item_id)
        delays.append((item.visible_at - item.updated_at).total_seconds())
        QueueItem.objects.filter(id=item.id).update(visible_at=item.created_at)  # due again now
    assert max(delays) <= 3600.0
    capped = delays[14:]  # 2^13 s and more before the jitter
    assert min(capped) >= 0.8 * 3600.0 and len(set(capped)) > 1  # still spread, below the cap
    assert 0.8 <= delays[0] <= 1.2
