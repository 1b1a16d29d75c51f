"""An event and the wait for it opening at the same moment (workflows/sql.py, EVENT_LOCK_KEY): the race forced in
both orders with a lock held while the other side arrives. One side's transaction is held open after its
statement (the wait's creation, in the settle of the step before it; or the event's send); the other side is
started, seen waiting on the advisory lock of the event's name and key (pg_locks), then the first commits. Either
way the event ends the wait, exactly once: none is lost (an event kept while its wait sits open, a wait left
open while its event is kept), none doubled.

In process: the settles are engine.lease/complete on their own connections (threads); no worker."""

import threading
from collections.abc import Callable

import pytest
from django.db import connections, transaction
from django.db.models import F

from queue_app import engine
from queue_app.models import QueueItem
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep
from queue_app.workflows.waits import send_event
from tests.support.waiting import ADVISORY_LOCK_WAITERS, seen_waiting

pytestmark = pytest.mark.django_db(transaction=True)
EVENT, KEY, PAYLOAD = "race.paid", "order-1", {"amount": 7}


def start() -> Workflow:
    """nap -> paid (waits for EVENT/KEY) -> after; the nap's item made due now, and leased."""
    g = Graph("race")
    nap = g.sleep("nap", seconds=3600)
    paid = g.wait_event("paid", event=EVENT, key=KEY, timeout=3600, after=[nap])
    g.task("queue_app.noop", name="after", after=[paid])
    w = services.start_graph(g)
    nap_step = WorkflowStep.objects.get(workflow_id=w.id, name="nap")
    QueueItem.objects.filter(id=nap_step.item_id).update(run_at=F("created_at"), visible_at=F("created_at"))
    return w


def open_wait(held) -> Callable[[], None]:
    return lambda: engine.complete(held, None)  # the nap ends: its settle opens the wait, in this transaction


def send() -> None:
    send_event(EVENT, KEY, PAYLOAD)


def race(first: Callable[[], None], second: Callable[[], None]) -> None:
    """`first` in a transaction held open once it ran; `second` started and seen blocked on the event lock;
    then `first` commits and `second` goes on."""
    done, release, errors = threading.Event(), threading.Event(), []

    def hold():
        try:
            with transaction.atomic():
                first()
                done.set()
                assert release.wait(30)
        except BaseException as e:  # noqa: BLE001  reported by the test
            errors.append(e)
            done.set()
        finally:
            connections.close_all()

    def then():
        try:
            second()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            connections.close_all()

    holder, other = threading.Thread(target=hold), threading.Thread(target=then)
    holder.start()
    assert done.wait(30) and not errors, errors
    other.start()
    try:
        seen_waiting(ADVISORY_LOCK_WAITERS, what="the second side waiting for the event lock")
        assert other.is_alive()  # still blocked: it has not matched (nor missed) anything yet
    finally:
        release.set()
        holder.join(30)
        other.join(30)
    assert not errors, errors


def assert_ended_once(w: Workflow) -> None:
    paid = WorkflowStep.objects.get(workflow_id=w.id, name="paid")
    (event,) = WorkflowEvent.objects.filter(name=EVENT, key=KEY)
    assert event.step_id == paid.id and event.claimed_at is not None
    assert paid.state == "succeeded" and paid.result == PAYLOAD
    after = WorkflowStep.objects.get(workflow_id=w.id, name="after")
    assert after.state == "queued" and QueueItem.objects.filter(workflow_step_id=after.id).count() == 1


def test_an_event_sent_while_its_wait_is_being_created_ends_it_once():
    w = start()
    (held,) = engine.lease(["default"], 1, worker_id="w1")
    race(open_wait(held), send)  # the wait's creation holds the lock; the send waits, then finds the open wait
    assert_ended_once(w)


def test_a_wait_created_while_its_event_is_being_sent_takes_it_once():
    w = start()
    (held,) = engine.lease(["default"], 1, worker_id="w1")
    race(send, open_wait(held))  # the send holds the lock (its event stored, kept); the wait's creation waits
    assert_ended_once(w)
