"""Nothing waits for the poll or behind a backlog when it need not: a re-delivered item keeps its place in line,
a retry starts at its backoff time, the next item of an ordering key starts when its predecessor settles; and a
worker back from being away (frozen, cut off) checks its leases and settles what it holds before acting on them.
Real `run_worker` processes with a 60 s poll, so that only the mechanisms under test can explain a start within
half a minute. (How prompt, in milliseconds, is for a benchmark to measure, not for a test on a shared machine.)"""

import os
import signal
import time

import pytest

from queue_app import engine, services
from queue_app.models import ExecutionLog, ItemState, QueueItem, Reservation
from queue_app.registry import get_task
from tests.support import worker_helpers as processes
from tests.support.waiting import wait_for
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks the workers --import)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
finish, output = processes.finish, processes.output
POLL = 60.0
SLOW_POLL = ("--poll-interval", f"{POLL:g}")


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
    assert 0.35 <= waited < POLL / 2, waited  # at its 0.4 s backoff, not at the poll


def test_the_next_item_of_an_ordering_key_starts_when_its_predecessor_settles(worker):
    first = get_task("queue_app.sleep").enqueue({"seconds": 0.5}, ordering_key="k").id
    second = get_task("queue_app.echo").enqueue({"n": 2}, ordering_key="k").id
    proc = worker("fifo-timer", "--concurrency", "2", *SLOW_POLL)
    wait_for(lambda: QueueItem.objects.get(id=second).state == ItemState.DONE, timeout=60, what="both items")
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)
    waited = (reservations(second)[0].reserved_at - QueueItem.objects.get(id=first).finished_at).total_seconds()
    assert 0 <= waited < POLL / 2, waited  # when the first settled, not at the next poll


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


def test_results_held_through_an_outage_are_settled_before_the_workers_own_rescue(worker, db_proxy):
    """The handlers finish while the database is cut off, and their leases (3 s) lapse before it is back: the
    worker's first round back settles what it holds before its own rescue runs (due every second), so nothing
    is taken back and run again. A real worker behind the chaos proxy, a real outage."""
    engine.ensure_queue("default")
    services.set_queue_options("default", lease_timeout=1.0)  # the task's floor: 1 s hard timeout + 2 s
    ids = get_task("tests.quick_probe").enqueue_many([{"sleep": 0.5}] * 2)
    proc = worker("held", "--concurrency", "2", "--prefetch", "0", env={"DATABASE_URL": db_proxy.url()})
    wait_for(lambda: ExecutionLog.objects.count() == 2, timeout=60, what="both handlers to start")
    assert db_proxy.cut(8) > 0  # the handlers finish (0.5 s) and their leases lapse (3 s) during the cut
    try:
        wait_for(
            lambda: QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == 2,
            timeout=90,
            what="the worker to settle both items once the database is back",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{output(proc)[-3000:]}") from None
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)[-3000:]
    for item_id in ids:
        [attempt] = reservations(item_id)  # one attempt each: no rescue re-delivered it
        assert attempt.outcome == "done", output(proc)[-3000:]
        assert attempt.finished_at > attempt.lease_expires_at  # settled after its lease had lapsed
    assert processes.runs_per_item() == dict.fromkeys(ids, 1)
    assert "database unavailable" in output(proc) and "stale item=" not in output(proc)


def test_a_worker_started_while_the_database_is_away_waits_for_it_then_runs(worker, db_proxy):
    """Started while the server restarts (the waits chaos run once caught a worker booting through one), the
    worker says so and waits, instead of dying in Django's system checks (which connect: a GeneratedField's check
    asks the server's version). The proxy refuses every connection until the worker has said it is waiting."""
    db_proxy.cut(3600)
    proc = worker("late-db", "--concurrency", "1", env={"DATABASE_URL": db_proxy.url()})
    wait_for(lambda: "database unavailable" in output(proc), timeout=60, what="the worker to say it waits")
    assert proc.poll() is None, output(proc)[-3000:]
    db_proxy.cut(0)  # the server is back
    item = get_task("queue_app.echo").enqueue({"n": 1}).id
    wait_for(lambda: QueueItem.objects.get(id=item).state == ItemState.DONE, timeout=60, what="the item to run")
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)[-3000:]
    assert "database back" in output(proc)


def test_a_worker_waiting_for_the_database_stops_on_sigterm_and_exits_0(worker, db_proxy):
    """SIGTERM while the worker waits for the database ends the wait: the handler only sets a flag and wakes the
    wait (queue_app/stop_signals.py; a threading.Event set from the handler could hang the process), and the worker
    exits 0 having taken nothing."""
    db_proxy.cut(3600)
    proc = worker("stop-while-waiting", "--concurrency", "1", env={"DATABASE_URL": db_proxy.url()})
    wait_for(lambda: "database unavailable" in output(proc), timeout=60, what="the worker to say it waits")
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)[-3000:]
    assert "database back" not in output(proc) and "worker started" not in output(proc)


def test_a_connection_lost_between_the_wait_and_the_checks_is_waited_out_not_a_crash():
    """The waits chaos run caught a worker whose database answered its wait, then restarted before its system
    checks ran: the checks got the dead connection ("the connection is closed") and the worker exited 1. Forced
    here: the boot's connection is terminated by the server after the wait, before the step runs."""
    import psycopg
    from django.db import connection

    from queue_app.worker.outage import boot_through_outages

    killed, ran = [], []

    def step():
        if not killed:  # the server drops this process's connection right after the wait found it up
            with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
            killed.append(1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            ran.append(cursor.fetchone()[0])

    assert boot_through_outages(step)
    assert killed == [1] and ran == [1]  # the first try failed on the dead connection, the second ran


def test_the_loops_first_statement_after_a_restart_at_the_end_of_the_boot_finds_a_connection_that_works():
    """The next window of the same boot (a sweep of restarts through a starting worker found it): the publish
    of the task declarations lost its connection, said so, and the supervisor's first statement (the engine's
    session settings on the connection it found open) got the dead connection and the worker exited 1. The
    engine's session call now drops a connection the server closed (the next one it opens is tuned)."""
    import psycopg
    from django.db import connection

    from queue_app.engine.db import engine_session_here

    connection.ensure_connection()
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    engine_session_here()  # raised OperationalError ("the connection is lost") before
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone()[0] == 1
