"""Nothing waits for the poll or behind a backlog when it need not: a re-delivered item keeps its place in line,
a retry starts at its backoff time, the next item of an ordering key starts when its predecessor settles; and a
worker back from being away (frozen, cut off) checks its leases and settles what it holds before acting on them.
Real `run_worker` processes with a 5 s poll, so that only the mechanisms under test can explain a prompt start."""

import os
import signal
import time

import pytest

from queue_app import engine, services
from queue_app.models import ExecutionLog, ItemState, QueueItem, Reservation
from queue_app.registry import get_task
from queue_app.worker import Supervisor, WorkerOptions
from queue_app.worker.pool import make_pool
from tests import test_worker_processes as processes
from tests import worker_tasks  # noqa: F401  (registers the tests.* tasks the workers --import)
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
finish, output = processes.finish, processes.output
SLOW_POLL = ("--poll-interval", "5")


def reservations(item_id: int) -> list[Reservation]:
    return list(Reservation.objects.filter(item_id=item_id).order_by("id"))


# -- a re-delivered item keeps its place ---------------------------------------------------------------------


def test_a_rescued_item_is_leased_again_ahead_of_the_items_that_became_due_after_it():
    first = engine.enqueue("queue_app.noop", {}, queue="line").id
    [held] = engine.lease(["line"], 1, "w-dies", lease_timeout=0.3)
    assert held.item_id == first
    later = engine.enqueue_many("queue_app.noop", [{}] * 30, queue="line")  # the backlog builds up meanwhile
    time.sleep(0.5)
    assert engine.rescue_expired() == (1, 0)
    again = engine.lease(["line"], 5, "w-next")
    assert [h.item_id for h in again] == [first, *later[:4]]


def test_a_rescued_item_with_an_ordering_key_still_goes_before_the_next_of_its_key():
    a, b = (engine.enqueue("queue_app.noop", {}, queue="line", ordering_key="k").id for _ in range(2))
    [held] = engine.lease(["line"], 10, "w-dies", lease_timeout=0.3)
    assert held.item_id == a
    time.sleep(0.5)
    engine.rescue_expired()
    assert [h.item_id for h in engine.lease(["line"], 10, "w-next")] == [a]
    assert QueueItem.objects.get(id=b).state == ItemState.READY


# -- timers instead of the poll ------------------------------------------------------------------------------


def test_a_retry_starts_at_its_backoff_time_not_at_the_next_poll(worker):
    item = get_task("tests.retry_soon").enqueue({}).id
    proc = worker("retry-timer", "--concurrency", "1", *SLOW_POLL)
    wait_for(lambda: QueueItem.objects.get(id=item).state == ItemState.DONE, timeout=60, what="the retry")
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)
    failed, retried = reservations(item)
    waited = (retried.reserved_at - failed.finished_at).total_seconds()
    assert 0.35 <= waited < 1.5, waited  # its 0.4 s backoff, not the 5 s poll


def test_the_next_item_of_an_ordering_key_starts_when_its_predecessor_settles(worker):
    first = get_task("queue_app.sleep").enqueue({"seconds": 0.5}, ordering_key="k").id
    second = get_task("queue_app.echo").enqueue({"n": 2}, ordering_key="k").id
    proc = worker("fifo-timer", "--concurrency", "2", *SLOW_POLL)
    wait_for(lambda: QueueItem.objects.get(id=second).state == ItemState.DONE, timeout=60, what="both items")
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)
    waited = (reservations(second)[0].reserved_at - QueueItem.objects.get(id=first).finished_at).total_seconds()
    assert 0 <= waited < 1.0, waited  # at once, not at the next poll 5 s later


# -- back from being away ------------------------------------------------------------------------------------


def test_a_worker_frozen_past_its_leases_never_starts_a_prefetched_item_it_no_longer_holds(worker):
    engine.ensure_queue("default")
    services.set_queue_options("default", lease_timeout=1.0)  # the task's floor: 1 s hard timeout + 2 s
    ids = get_task("tests.quick_probe").enqueue_many([{"sleep": 0.6}] * 6)
    proc = worker("frozen", "--concurrency", "1", "--prefetch", "4", "--hold", "0", "--pool", "process")
    wait_for(lambda: ExecutionLog.objects.exists(), timeout=60, what="the first run")
    os.killpg(proc.pid, signal.SIGSTOP)  # the worker and its child: a paused VM
    try:
        time.sleep(3.5)  # every lease it holds (3 s) lapses
        lapsed = set(Reservation.objects.filter(worker_id="frozen", outcome__isnull=True).values_list("id", flat=True))
        rescued, _ = engine.rescue_expired()
        assert rescued == len(lapsed) >= 4  # the running item and what it had prefetched
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    wait_for(
        lambda: QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == len(ids),
        timeout=60,
        what="every item to be run again and settled",
    )
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)
    ran_under = set(ExecutionLog.objects.values_list("reservation_id", flat=True))
    # With one slot, at most two of its lapsed reservations were in its pool's hands at the freeze: the item that
    # had finished (unsettled) and the one handed to the child next (which may log its run only after SIGCONT).
    # The rest were prefetched, never started: none may start under a lease taken back while it was away.
    prefetched = set(sorted(lapsed)[2:])
    assert len(prefetched) >= 2 and not ran_under & prefetched, (sorted(lapsed), sorted(ran_under & lapsed))
    assert "worker was away" in output(proc)


def test_results_held_through_an_outage_are_settled_before_the_workers_own_rescue():
    item = engine.enqueue("queue_app.echo", {"x": 1}).id
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=1, scheduler=False))
    supervisor.pool = make_pool("thread", 1)
    supervisor.pool.start()
    try:
        [lease] = engine.lease(None, 1, supervisor.worker_id, lease_timeout=0.3)
        supervisor.done = [(lease, {"x": 1})]  # its handler returned; then the database went away
        time.sleep(0.5)  # longer than the lease
        supervisor.db_down_since = time.monotonic() - 12  # ... and is back now
        supervisor._database_steps(time.monotonic())  # rescue (due at once) and lease in the same round
    finally:
        supervisor.pool.shutdown()
        supervisor.lease_call.close()  # the lease it sent: its thread ends, with its connection
    stored = QueueItem.objects.get(id=item)
    assert (stored.state, stored.result) == (ItemState.DONE, {"x": 1})
    assert [r.outcome for r in reservations(item)] == ["done"]
