"""The supervisor's rules, run in process with the thread pool (fast): settling by delivery mode and retry
policy, poison, hard timeouts, pause, --max-items, the Worker row, lease renewal, maintenance, status output.
The guarantees under crashes and restarts are proved with real processes in test_worker_processes.py."""

import io
import logging
import os
import signal
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connections
from django.utils import timezone

from queue_app import engine, services
from queue_app.engine import sql
from queue_app.models import DeadLetter, ExecutionLog, ItemState, QueueItem, Reservation, Worker
from queue_app.probes.tasks import close_log_connection
from queue_app.registry import LEASE_MARGIN, get_task
from queue_app.worker import Supervisor, WorkerOptions
from queue_app.worker.maintenance import Maintenance, Unit
from queue_app.worker.replace import REPLACE
from queue_app.worker.status import Stats, StatusReporter
from queue_app.worker.supervisor import OTHER_CONNECTIONS
from tests.support.worker_helpers import run_worker
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_probe_log_connection():
    yield
    close_log_connection()


def enqueue(task: str, payload=None, **options) -> int:
    return get_task(task).enqueue(payload or {}, **options).id


def outcomes(item_id: int) -> list[str]:
    return list(Reservation.objects.filter(item_id=item_id).order_by("id").values_list("outcome", flat=True))


def test_failed_attempts_are_retried_under_the_task_retry_policy_until_done():
    item = enqueue("tests.flaky", {"succeed_on": 3})
    run_worker()
    stored = QueueItem.objects.get(id=item)
    assert (stored.state, stored.result) == (ItemState.DONE, {"attempt": 3})
    assert outcomes(item) == ["retry", "retry", "done"]


def test_item_out_of_attempts_becomes_a_dead_letter():
    item = enqueue("tests.flaky", {"succeed_on": 99})
    run_worker()
    assert QueueItem.objects.get(id=item).state == ItemState.DEAD
    assert outcomes(item) == ["retry", "retry", "dead"]
    assert DeadLetter.objects.get(item_id=item).reason == "max attempts exhausted"


def test_task_retry_policy_caps_attempts_of_items_enqueued_without_it():
    item = engine.enqueue("tests.flaky", {"succeed_on": 99}, max_attempts=10).id
    run_worker()
    assert outcomes(item) == ["retry", "retry", "dead"]
    assert DeadLetter.objects.get(item_id=item).reason == "max attempts exhausted"


def test_exception_the_retry_policy_ignores_is_dead_lettered_at_once():
    item = enqueue("tests.unfixable")
    run_worker()
    letter = DeadLetter.objects.get(item_id=item)
    assert letter.reason.startswith("not retryable: Unfixable")
    assert outcomes(item) == ["dead"]


def test_at_most_once_failure_is_recorded_as_dead_letter_and_never_retried():
    item = enqueue("queue_app.probe_at_most_once", {"fail": True})
    run_worker()
    assert QueueItem.objects.get(id=item).state == ItemState.DEAD
    assert DeadLetter.objects.get(item_id=item).reason == "at-most-once attempt failed (not retried)"
    assert ExecutionLog.objects.filter(item_id=item).count() == 1
    assert outcomes(item) == ["dead"]


def test_at_most_once_item_is_recorded_as_started_before_its_handler_runs_and_done_after():
    item = enqueue("queue_app.probe_at_most_once")
    run_worker()
    run = ExecutionLog.objects.get(item_id=item)
    [reservation] = Reservation.objects.filter(item_id=item)
    stored = QueueItem.objects.get(id=item)
    assert reservation.started_at <= run.executed_at <= stored.finished_at
    assert (stored.state, stored.max_attempts, reservation.outcome) == (ItemState.DONE, 1, "done")


def test_unknown_task_and_undecodable_payload_go_to_the_dead_letters():
    unknown = engine.enqueue("no.such.task", {}).id
    undecodable = enqueue("queue_app.sleep", {"seconds": "soon"})
    fine = enqueue("queue_app.echo", {"x": 1})
    supervisor = run_worker()
    assert DeadLetter.objects.get(item_id=unknown).reason == "unknown task: no.such.task"
    assert DeadLetter.objects.get(item_id=undecodable).reason.startswith("undecodable payload: ValueError")
    assert QueueItem.objects.get(id=fine).result == {"x": 1}
    assert supervisor.stats.dead == 2


def test_result_that_is_not_json_fails_the_attempt():
    item = enqueue("tests.not_json")
    run_worker()
    stored = QueueItem.objects.get(id=item)
    assert stored.state == ItemState.DEAD and "not JSON-serializable" in stored.error


def test_thread_past_its_hard_timeout_is_abandoned_and_its_process_is_to_be_replaced_once_the_rest_settled():
    item = enqueue("tests.sleepy", {"seconds": 2.5})
    other = enqueue("queue_app.echo", {"still": "working"})
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=2, burst=True, poll_interval=0.1))
    assert supervisor.run() == REPLACE  # run_worker then execs itself again (tested in test_worker_processes.py)
    assert outcomes(item) == ["timed_out"]
    stored = QueueItem.objects.get(id=item)
    assert stored.state == ItemState.READY and "hard timeout" in stored.error and "abandoned" in stored.error
    assert QueueItem.objects.get(id=other).state == ItemState.DONE
    assert supervisor.stats.timed_out == 1
    assert Worker.objects.get(id=supervisor.worker_id).state == "stopped"


def test_a_signal_while_waiting_to_replace_the_process_stops_it_instead():
    enqueue("tests.sleepy", {"seconds": 2.5})
    held = enqueue("tests.gated")  # in flight until the signal is sent: the worker waits for it to settle
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=2, poll_interval=0.1))
    worker_tasks.GATE.clear()

    def stop_once_replacing() -> None:
        deadline = time.monotonic() + 30
        while not supervisor.shutdown.replacing and time.monotonic() < deadline:
            time.sleep(0.01)
        supervisor._on_signal(signal.SIGTERM, None)  # what SIGTERM does, without signalling this process
        worker_tasks.GATE.set()

    stopper = threading.Thread(target=stop_once_replacing)
    stopper.start()
    assert supervisor.run() == 0
    stopper.join()
    assert not supervisor.shutdown.replacing
    assert QueueItem.objects.get(id=held).result is True  # finished within the grace period, not cut short


def test_paused_queue_is_not_leased():
    item = enqueue("queue_app.noop")
    services.pause_queue("default")
    run_worker()
    assert QueueItem.objects.get(id=item).state == ItemState.READY


def test_max_items_stops_the_worker_after_that_many_items():
    engine.enqueue_many("queue_app.noop", [{}] * 5)
    run_worker(burst=False, max_items=3, concurrency=1)
    assert QueueItem.objects.filter(state=ItemState.DONE).count() == 3
    assert QueueItem.objects.filter(state=ItemState.READY).count() == 2


def test_worker_registers_itself_and_is_marked_stopped_with_its_stats():
    engine.enqueue_many("queue_app.noop", [{}] * 4)
    supervisor = run_worker(worker_id="w-inproc", queues=["default"])
    row = Worker.objects.get(id="w-inproc")
    assert (row.state, row.queues, row.concurrency) == ("stopped", ["default"], 2)
    assert row.stats["processed"] == 4 == supervisor.stats.processed
    assert set(Reservation.objects.values_list("worker_id", flat=True)) == {"w-inproc"}


def test_worker_leases_only_from_its_queues():
    mine = enqueue("queue_app.noop", queue="mine")
    theirs = enqueue("queue_app.noop", queue="theirs")
    run_worker(queues=["mine"])
    assert QueueItem.objects.get(id=mine).state == ItemState.DONE
    assert QueueItem.objects.get(id=theirs).state == ItemState.READY


def test_lease_is_never_shorter_than_hard_timeout_plus_margin():
    enqueue("queue_app.probe")
    services.set_queue_options("default", lease_timeout=0.5)
    (held,) = engine.lease(None, 1, "w")
    task = get_task("queue_app.probe")
    current = engine.renew_leases([engine.LeaseTerms(held, None, task.min_lease)], keep_longer=False, tolerance=0.5)
    remaining = (current[held.reservation_id] - timezone.now()).total_seconds()
    assert task.min_lease - 0.5 < remaining <= task.min_lease == task.hard_timeout + LEASE_MARGIN


def test_task_lease_replaces_queue_lease_and_heartbeat_never_shortens_it():
    enqueue("queue_app.probe")
    (held,) = engine.lease(None, 1, "w")
    terms = engine.LeaseTerms(held, 30.0, 7.0)
    first = engine.renew_leases([terms], keep_longer=False)[held.reservation_id]
    assert 29 < (first - timezone.now()).total_seconds() <= 30
    engine.extend(held, 600)  # the handler asked for more
    assert engine.renew_leases([terms], keep_longer=True) == {held.reservation_id: None}
    QueueItem.objects.filter(id=held.item_id).update(state=ItemState.CANCELLED)
    assert engine.renew_leases([terms], keep_longer=True) == {}  # stale


def test_silent_workers_are_marked_stopped_then_forgotten():
    now = timezone.now()
    common = {"host": "h", "pid": 1, "started_at": now - timedelta(hours=1), "state": "running"}
    Worker.objects.create(id="alive", last_heartbeat=now, **common)
    Worker.objects.create(id="silent", last_heartbeat=now - timedelta(minutes=5), **common)
    Worker.objects.create(id="long-gone", last_heartbeat=now - timedelta(hours=1), **common)
    assert engine.sweep_workers(lost_after=60, forget_after=600) == (1, 1)
    assert dict(Worker.objects.values_list("id", "state")) == {"alive": "running", "silent": "stopped"}


def test_maintenance_unit_runs_in_one_worker_at_a_time():
    runs = []
    unit = Unit("test-unit", 0.0, lambda: (runs.append(1) or {"n": 1}, False))
    holder = engine.dedicated_connection()
    try:
        holder.execute("BEGIN")
        holder.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (engine.workers.MAINTENANCE_LOCK_NAMESPACE, "test-unit")
        )
        Maintenance([unit]).run_due()
        assert runs == []  # another worker holds it
        holder.execute("COMMIT")
        unit.due_at = 0.0
        Maintenance([unit]).run_due()
        assert runs == [1]
    finally:
        holder.close()


def test_status_line_refreshes_in_place_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    reporter = StatusReporter(stream)
    reporter.tick(Stats(processed=5, failed=1), in_flight=3, state="running", db_ok=True)
    line = stream.getvalue()
    assert line.startswith("\r\x1b[K") and "processed=5" in line and "in_flight=3" in line and "failed=1" in line
    logging.getLogger("jobsite.worker").info("a log line")
    assert stream.getvalue() == line + "\r\x1b[K"  # the status line is wiped before a log line
    reporter.close()
    assert reporter not in logging.getLogger("jobsite.worker").filters


def test_status_goes_to_structured_log_lines_off_a_terminal(caplog):
    reporter = StatusReporter(io.StringIO())
    with caplog.at_level(logging.INFO, logger="jobsite.worker"):
        reporter.tick(Stats(processed=7), in_flight=1, state="running", db_ok=False)
    (record,) = caplog.records
    assert "processed=7" in record.getMessage() and "db=down" in record.getMessage()


def test_error_text_postgres_cannot_store_is_made_storable():
    item = enqueue("tests.nasty_error")
    run_worker()
    stored = QueueItem.objects.get(id=item)
    assert stored.state == ItemState.DEAD
    assert "NUL \\x00 and a lone surrogate \\udcff" in stored.error and stored.error.endswith("(truncated)")


def test_a_stop_never_takes_back_an_at_most_once_item_whose_thread_has_not_started_it_yet(monkeypatch):
    """An at-most-once item is settled done before it is handed to an idle thread; a stop coming before that
    thread picks it up (here: threads slow to connect) must let it run, not hand it back done and never run
    (found by the chaos run: a worker SIGTERMed 90 ms after it started)."""
    from queue_app.worker import pool

    connect = pool._warm_connection
    monkeypatch.setattr(pool, "_warm_connection", lambda: (time.sleep(0.6), connect()))
    items = [enqueue("queue_app.probe_at_most_once") for _ in range(2)]
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=2, poll_interval=0.1))

    def stop_when_handed_over() -> None:
        deadline = time.monotonic() + 10
        while len(supervisor.running) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        supervisor._on_signal(signal.SIGTERM, None)  # what SIGTERM does, without signalling this process

    stopper = threading.Thread(target=stop_when_handed_over)
    stopper.start()
    assert supervisor.run() == 0
    stopper.join()

    assert sorted(ExecutionLog.objects.values_list("item_id", flat=True)) == sorted(items)  # both ran, once
    assert set(QueueItem.objects.filter(id__in=items).values_list("state", flat=True)) == {ItemState.DONE}
    assert supervisor.stats.stale == 0


def test_connection_room_counts_every_client_connection_open():
    # The room is the server's: another test process (the other xdist worker's workers and children) may open or
    # close connections at any moment. Look until nobody else did between our three reads, then assert. A count
    # that misses our connection never shows `before - 1`, whatever the others do: the test still fails then.
    for _ in range(50):
        before = engine.connection_room()
        with engine.dedicated_connection() as conn:
            conn.execute("SELECT 1")
            during = engine.connection_room()
        time.sleep(0.05)  # the closed backend leaves pg_stat_activity as it exits
        if engine.connection_room() == before and during == before - 1:
            break
    assert during == before - 1


def test_connection_room_is_capped_by_the_roles_own_connection_limit():
    role = f"jobsite_limited_{os.getpid()}"
    with engine.dedicated_connection() as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER CONNECTION LIMIT 3")
        try:
            params = {**connections["default"].get_connection_params(), "user": role, "password": ""}
            with psycopg.connect(**params, autocommit=True) as limited:
                assert limited.execute(sql.CONNECTION_ROOM).fetchone()[0] == 2  # 3, less this one
        finally:
            admin.execute(f"DROP ROLE {role}")


def test_a_worker_shrinks_to_fit_when_the_server_has_too_few_connections_left(caplog):
    # The room is the server's and the other xdist worker's processes change it at any moment: look until the
    # room read before the check is the room read after it, so the check saw that room too.
    caplog.set_level(logging.WARNING, logger="jobsite.worker")
    for _ in range(50):
        caplog.clear()
        room = engine.connection_room()
        worker = Supervisor(WorkerOptions(pool="thread", concurrency=room))
        worker.check_connection_room()
        if engine.connection_room() == room:
            break
    [warning] = [r.getMessage() for r in caplog.records if "too few database connections" in r.getMessage()]
    other = OTHER_CONNECTIONS  # its LISTEN, lease and maintenance connections
    assert f"needs={room + other} server_has_room_for={room}" in warning
    assert f"running with --concurrency {room - other} instead" in warning
    fits = room - other
    assert (worker.options.concurrency, worker.pacing.capacity, worker.row.concurrency) == (fits, 2 * fits, fits)
    caplog.clear()
    Supervisor(WorkerOptions(pool="thread", concurrency=max(1, room - 10))).check_connection_room()
    assert not [r for r in caplog.records if "too few database connections" in r.getMessage()]


def test_what_a_worker_holds_follows_its_pace_and_the_whole_prefetch_through_a_backlog():
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=2, prefetch=100, hold=0.025))
    assert supervisor.pacing.held_most() == 2 + 2  # no pace measured yet: --concurrency beyond the slots
    supervisor.pacing.pace = 4_000.0  # items a second: 25 ms of work is 100 items
    assert supervisor.pacing.held_most() == 2 + 100
    supervisor.pacing.pace = 400.0
    assert supervisor.pacing.held_most() == 2 + 10
    supervisor.pacing.ran_dry_at = time.monotonic() - 5  # no slot has lacked work for 5 s: a backlog
    assert supervisor.pacing.held_most() == 2 + 100
    unheld = Supervisor(WorkerOptions(pool="thread", concurrency=2, prefetch=100, hold=0))
    assert unheld.pacing.held_most() == 2 + 100  # --hold 0: the whole prefetch, whatever the pace
    default = Supervisor(WorkerOptions(pool="thread", concurrency=8))
    default.pacing.pace = 1.0
    assert default.pacing.held_most() == 8 + 8  # the default prefetch (--concurrency) is never held back


@pytest.mark.parametrize("hold", [-0.1, float("nan"), float("inf")])
def test_a_hold_that_is_not_a_number_of_seconds_is_refused(hold):
    assert any(p.startswith("--hold must be a number of seconds") for p in WorkerOptions(hold=hold).problems())
