"""The worker's guarantees, proved with real `manage.py run_worker` processes against real PostgreSQL.

The probe tasks record every run of their handler in ExecutionLog (outside the handler's transaction) and
their database effect in ProbeEffect; these tests count those rows after killing workers, stopping them,
and restarting the database server under them.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from jobsite import embedded_pg
from queue_app import engine, services
from queue_app.engine import sql
from queue_app.models import DeadLetter, ExecutionLog, ItemState, ProbeEffect, QueueItem, Reservation, Worker
from queue_app.registry import get_task
from queue_app.worker.replace import REPLACES_ENV, STOP_SIGNALS
from tests.support.lease_sampler import LiveReservations
from tests.support.locks import blocked_by
from tests.support.waiting import wait_for
from tests.support.worker_helpers import finish, held_by, open_items, output, runs_per_item, short_leases
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks the workers --import)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = "queue_app.probe"


def past_first_lease(proc: subprocess.Popen) -> bool:
    """The worker's first loop step is over, its first lease with it: a fresh worker leases in that step's own
    thread (nothing in hand to overlap with) and logs its first status line at the end of the step."""
    return "status state=running" in output(proc)


def test_three_workers_run_each_of_10000_probes_exactly_once(worker):
    ids = get_task(PROBE).enqueue_many([{}] * 10_000)
    workers = [worker(f"w{n}", "--burst", "--concurrency", "4") for n in range(3)]
    for proc in workers:
        assert finish(proc, timeout=300) == 0, output(proc)
    assert QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == 10_000
    runs = runs_per_item()
    assert set(runs) == set(ids) and set(runs.values()) == {1}
    assert set(ExecutionLog.objects.values_list("worker_id", flat=True)) == {"w0", "w1", "w2"}
    assert not ProbeEffect.objects.exclude(applied=1).exists()
    assert set(Worker.objects.values_list("state", flat=True)) == {"stopped"}


def test_a_worker_working_through_a_backlog_leases_whole_batches_despite_hold(worker):
    """--hold keeps a worker under a steady load from holding more than a moment of work; once its leases have
    found all they asked for during a second (a backlog), it holds its whole prefetch. Slots that empty between
    two lease round trips while short jobs drain are not the queue running dry: taken for it, they kept this
    drain at leases of ~4 + pace x 0.005 items (under 70 at this machine's pace)."""
    get_task("queue_app.noop").enqueue_many([{}] * 30_000)
    proc = worker(
        "w0", "--burst", "--pool", "thread", "--concurrency", "4", "--prefetch", "300", "--batch", "300",
        "--hold", "0.005",
    )  # fmt: skip
    assert finish(proc, timeout=300) == 0, output(proc)
    assert not open_items()
    # One lease statement, one now(): its reservations share their reserved_at.
    sizes = list(Reservation.objects.values("reserved_at").annotate(n=Count("id")).values_list("n", flat=True))
    assert sum(sizes) == 30_000
    assert max(sizes) >= 150, sorted(sizes)[-10:]


def test_kill_9_loses_nothing_and_repeats_only_items_in_flight_in_the_killed_worker(worker):
    short_leases()
    ids = get_task(PROBE).enqueue_many([{"sleep": 0.02}] * 600)
    victim = worker("victim", "--concurrency", "4")
    wait_for(lambda: ExecutionLog.objects.count() >= 100, timeout=60, what="the victim to get going")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    in_flight = held_by("victim")
    assert in_flight, "the kill should land mid-batch"
    survivor = worker("survivor", "--concurrency", "4")
    wait_for(lambda: open_items() == 0, timeout=120, what="every item to be settled")
    survivor.terminate()
    assert finish(survivor, timeout=30) == 0
    assert QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == len(ids)
    runs = runs_per_item()
    assert set(runs) == set(ids)  # none lost
    repeated = {item for item, n in runs.items() if n > 1}
    assert repeated <= in_flight  # duplicates only where the killed worker was holding the item
    assert set(
        Reservation.objects.filter(worker_id="victim", item_id__in=in_flight).values_list("outcome", flat=True)
    ) == {"expired"}


def test_sigterm_finishes_in_flight_items_and_exits_0(worker):
    ids = get_task(PROBE).enqueue_many([{"sleep": 0.5}] * 12)
    proc = worker("drain", "--concurrency", "2")
    wait_for(lambda: ExecutionLog.objects.count() >= 2, timeout=30, what="handlers to start")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, timeout=20) == 0
    assert not QueueItem.objects.filter(state=ItemState.RESERVED).exists()
    done = set(QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).values_list("id", flat=True))
    assert set(runs_per_item()) == done and 2 <= len(done) < len(ids)  # in-flight finished, no new leases
    # Items held in hand (prefetched, never started) are handed back unspent; nothing else ends otherwise.
    outcomes = dict(Reservation.objects.filter(worker_id="drain").values_list("item_id", "outcome"))
    assert set(outcomes.values()) <= {"done", "released"}
    released = [item for item, outcome in outcomes.items() if outcome == "released"]
    assert set(QueueItem.objects.filter(id__in=released).values_list("state", "attempts")) <= {(ItemState.READY, 0)}
    assert Worker.objects.get(id="drain").state == "stopped"
    assert "worker stopped" in output(proc)


def test_sigterm_hands_back_what_the_grace_period_cannot_finish(worker):
    ids = get_task(PROBE).enqueue_many([{"sleep": 4}] * 2)
    proc = worker("hasty", "--concurrency", "2", "--grace-period", "0.5")
    wait_for(lambda: ExecutionLog.objects.count() == 2, timeout=30, what="both handlers to start")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, timeout=10) == 0
    for item in QueueItem.objects.filter(id__in=ids):
        assert (item.state, item.attempts) == (ItemState.READY, 0)  # released: the attempt is not spent
    assert set(Reservation.objects.values_list("outcome", flat=True)) == {"released"}


def test_second_signal_exits_at_once_and_leaves_leases_to_expire(worker):
    get_task(PROBE).enqueue_many([{"sleep": 4}] * 2)
    proc = worker("impatient", "--concurrency", "2")
    wait_for(lambda: ExecutionLog.objects.count() == 2, timeout=30, what="both handlers to start")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: stopping" in output(proc), timeout=30, what="the first signal to be taken")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, timeout=30) == 1, output(proc)[-3000:]
    # At once: a graceful stop would have waited for the two handlers (4 s each) and settled them.
    assert QueueItem.objects.filter(state=ItemState.RESERVED).count() == 2
    assert "second SIGTERM: exiting at once" in output(proc)


def test_handler_past_its_hard_timeout_is_killed_and_the_worker_keeps_working(worker):
    stuck = get_task("tests.sleepy").enqueue({"seconds": 60}).id
    probes = get_task(PROBE).enqueue_many([{"sleep": 0.1}] * 20)
    proc = worker("timer", "--burst", "--concurrency", "2")
    assert finish(proc, timeout=30) == 0, output(proc)
    item = QueueItem.objects.get(id=stuck)
    assert item.state == ItemState.DEAD and "child process was killed" in item.error
    assert list(Reservation.objects.filter(item_id=stuck).values_list("outcome", flat=True)) == ["timed_out"] * 2
    assert QueueItem.objects.filter(id__in=probes, state=ItemState.DONE).count() == 20


def test_thread_stuck_past_its_hard_timeout_gets_its_worker_process_replaced_after_the_rest_settled(worker):
    # tests.sleepy: hard timeout 1 s, two attempts; each attempt returns late (at 2.5 s), while the slow probe
    # leased beside the first one still runs (3.5 s): that late return must settle nothing.
    stuck = get_task("tests.sleepy").enqueue({"seconds": 2.5}).id
    slow = get_task(PROBE).enqueue({"sleep": 3.5}).id
    quick = get_task(PROBE).enqueue_many([{"sleep": 0.05}] * 20)
    proc = worker("stuck", "--pool", "thread", "--concurrency", "3")
    wait_for(lambda: QueueItem.objects.filter(id=stuck, state=ItemState.DEAD).exists(), timeout=90, what="two timeouts")
    # Each timeout replaced the process: the third one is up and leases what comes next.
    wait_for(lambda: output(proc).count("worker started") == 3, timeout=60, what="the second replacement")
    fresh = get_task(PROBE).enqueue_many([{}] * 10)
    wait_for(
        lambda: QueueItem.objects.filter(id__in=fresh, state=ItemState.DONE).count() == 10, timeout=60, what="new items"
    )
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    log = output(proc)

    assert outcomes_of(stuck) == ["timed_out", "timed_out"]
    assert "abandoned" in QueueItem.objects.get(id=stuck).error
    assert outcomes_of(slow) == ["done"]  # finished in the old process, not handed back or cut short
    assert runs_per_item() == Counter(dict.fromkeys([slow, *quick, *fresh], 1))
    assert QueueItem.objects.filter(id__in=[slow, *quick], state=ItemState.DONE).count() == 21
    assert log.count("a handler thread is stuck past its hard timeout") == 2  # said once per stuck thread
    assert log.count("replacing the worker process now") == 2
    assert log.count("replaces=stuck") == 2
    assert "stale item=" not in log  # no late outcome reached a settle
    assert Worker.objects.get(id="stuck").pid == proc.pid  # the same process id: replaced by exec


def test_a_sigterm_sent_while_a_replacement_starts_up_stops_it_gracefully(spawn, tmp_path):
    log = tmp_path / "replacement.log"
    with log.open("w") as out:
        proc = spawn(
            "run_worker", "--worker-id", "replacement", "--pool", "thread", "--concurrency", "1",
            stdout=out,
            env={REPLACES_ENV: json.dumps({"worker_id": "stuck-before", "taken": 0})},
            # as replace_process() leaves them across its exec: blocked, so that one sent meanwhile waits
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS),
        )  # fmt: skip
    proc.send_signal(signal.SIGTERM)  # before its handlers exist: pending, not the default action (death)
    proc.log = log
    assert finish(proc, timeout=60) == 0, output(proc)
    text = output(proc)
    assert "replaces=stuck-before" in text and "SIGTERM: stopping" in text


def test_a_stuck_transactional_thread_lets_go_of_its_item_when_its_process_is_replaced(worker):
    # Its transaction holds the item's row lock: no lease could take the item again while that thread lived.
    short_leases()  # its lease: the task's hard timeout + margin, 3 s
    item = get_task("tests.stuck_transactional").enqueue({"seconds": 600}).id
    proc = worker("txn-stuck", "--pool", "thread", "--concurrency", "2")
    wait_for(
        lambda: QueueItem.objects.filter(id=item, state=ItemState.DONE).exists(),
        timeout=90,
        what="the item done by its second attempt, long before the stuck one would return",
    )
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    assert sorted(ExecutionLog.objects.filter(item_id=item).values_list("attempt", flat=True)) == [1, 2]
    assert ProbeEffect.objects.get(key=str(item)).applied == 1  # the stuck attempt's write was rolled back
    assert outcomes_of(item) == ["expired", "done"]
    assert output(proc).count("replacing the worker process now") == 1


@pytest.fixture
def limited_role():
    """A DATABASE_URL for the test database as a role that may open at most 6 connections (CONNECTION LIMIT),
    with the rights a worker needs on the app's tables."""
    role = f"jobsite_narrow_{os.getpid()}"
    params = connection.get_connection_params()
    with connection.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER CONNECTION LIMIT 6")
        cur.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cur.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    host, port = str(params.get("host") or "localhost"), params.get("port") or 5432
    if host.startswith("/"):  # a unix socket directory (the embedded server): django-environ takes it in the path
        url = f"postgres://{role}@:{port}/{quote(host, safe='')}/{params['dbname']}"
    else:
        url = f"postgres://{role}@{host}:{port}/{params['dbname']}"
    try:
        yield url
    finally:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
                [role],
            )
            cur.execute(f"DROP OWNED BY {role}")
            cur.execute(f"DROP ROLE {role}")


def test_worker_with_too_few_connections_left_shrinks_to_fit_says_so_once_and_works(worker, limited_role):
    ids = engine.enqueue_many("queue_app.noop", [{}] * 300)  # a handler that opens no connection of its own
    # 6 for the role, 1 of them the worker's own at its check: room for 5, so 2 pool threads beside its own, its
    # LISTEN and lease threads' connections (and a vacuum's), where --concurrency 12 would open 15.
    proc = worker("narrow", "--pool", "thread", "--concurrency", "12", "--burst", env={"DATABASE_URL": limited_role})
    assert finish(proc, timeout=120) == 0, output(proc)
    log = output(proc)

    assert log.count("too few database connections left for this worker") == 1
    assert "needs=15 server_has_room_for=5; running with --concurrency 2 instead" in log
    assert "concurrency=2" in log.split("worker started", 1)[1].splitlines()[0]
    assert "database unavailable" not in log and "too many" not in log  # no connection was refused
    assert QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == 300
    assert Worker.objects.get(id="narrow").concurrency == 2


def outcomes_of(item_id: int) -> list[str]:
    return list(Reservation.objects.filter(item_id=item_id).order_by("id").values_list("outcome", flat=True))


def test_at_most_once_probe_killed_mid_handler_is_a_dead_letter_saying_so_and_never_runs_twice(worker):
    short_leases()
    ids = get_task("queue_app.probe_at_most_once").enqueue_many([{"sleep": 0.3}] * 120)
    victim = worker("amo-victim", "--concurrency", "4")
    wait_for(lambda: ExecutionLog.objects.count() >= 12, timeout=60, what="the victim to get going")
    victim.send_signal(signal.SIGKILL)  # four handlers are asleep mid-run
    victim.wait(10)
    survivor = worker("amo-survivor", "--concurrency", "4")
    wait_for(lambda: open_items() == 0, timeout=120, what="every item to be settled")
    survivor.terminate()
    assert finish(survivor, timeout=30) == 0
    runs = runs_per_item()
    assert max(runs.values()) == 1
    # Done means it ran, once: nothing is done that a fault kept from running (or stopped mid-run).
    done = set(QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).values_list("id", flat=True))
    assert done <= set(runs)
    lapsed = Reservation.objects.filter(item_id__in=ids, worker_id="amo-victim", outcome="expired")
    mid_run = set(lapsed.filter(started_at__isnull=False).values_list("item_id", flat=True))
    never_started = set(lapsed.filter(started_at__isnull=True).values_list("item_id", flat=True))
    assert 1 <= len(mid_run) <= 4  # the handlers running when the victim died
    dead = dict(DeadLetter.objects.filter(item_id__in=ids).values_list("item_id", "reason"))
    assert set(dead) == mid_run | never_started == set(ids) - done
    assert {dead[i] for i in mid_run} == {sql.DeadReason.AT_MOST_ONCE_STOPPED}
    assert all(QueueItem.objects.get(id=i).error == sql.DeadReason.AT_MOST_ONCE_STOPPED_ERROR for i in mid_run)
    # Leased but never started: it never ran; with its one attempt spent by the lapsed lease it is a dead letter.
    assert not never_started & set(runs)
    assert {dead[i] for i in never_started} <= {"lease expired on the last attempt"}


def test_transactional_probe_killed_between_handler_and_settle_applies_its_write_once(worker):
    short_leases()
    ids = get_task("queue_app.probe_transactional").enqueue_many([{"sleep": 0.3}] * 40)
    victim = worker("tx-victim", "--concurrency", "4")
    wait_for(lambda: ExecutionLog.objects.count() >= 8, timeout=60, what="the victim to get going")
    victim.send_signal(signal.SIGKILL)  # handlers are asleep after their write, before their settle
    victim.wait(10)
    survivor = worker("tx-survivor", "--concurrency", "4")
    wait_for(lambda: open_items() == 0, timeout=120, what="every item to be settled")
    survivor.terminate()
    assert finish(survivor, timeout=30) == 0
    assert QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == len(ids)
    effects = dict(ProbeEffect.objects.values_list("key", "applied"))
    assert effects == {str(item): 1 for item in ids}
    assert max(runs_per_item().values()) == 2  # some handlers did run twice: their first write rolled back


def test_unknown_task_and_undecodable_payload_are_dead_lettered_while_the_worker_keeps_running(worker):
    unknown = engine.enqueue("no.such.task", {"x": 1}).id
    undecodable = get_task("queue_app.sleep").enqueue({"seconds": "a while"}).id
    probes = get_task(PROBE).enqueue_many([{}] * 10)
    proc = worker("poison", "--burst", "--concurrency", "2")
    assert finish(proc, timeout=30) == 0, output(proc)
    assert DeadLetter.objects.get(item_id=unknown).reason == "unknown task: no.such.task"
    assert DeadLetter.objects.get(item_id=undecodable).reason.startswith("undecodable payload: ValueError")
    assert QueueItem.objects.filter(id__in=probes, state=ItemState.DONE).count() == 10


@pytest.mark.parametrize(
    ("how", "expected"),
    [("exit", "exited with code 3"), ("segfault", "killed by SIGSEGV"), ("system_exit", "SystemExit: 4")],
)
def test_child_process_that_dies_fails_its_attempt_and_the_worker_carries_on(worker, how, expected):
    crash = get_task("tests.crash").enqueue({"how": how}).id
    probes = get_task(PROBE).enqueue_many([{}] * 5)
    proc = worker(f"crash-{how}", "--burst", "--concurrency", "1")
    assert finish(proc, timeout=30) == 0, output(proc)
    item = QueueItem.objects.get(id=crash)
    assert item.state == ItemState.DEAD and expected in item.error
    assert QueueItem.objects.filter(id__in=probes, state=ItemState.DONE).count() == 5


def test_worker_refuses_to_start_with_a_task_whose_lease_is_not_longer_than_its_hard_timeout(manage):
    result = manage("run_worker", "--burst", "--import", "tests.tasks.worker_tasks_bad_lease")
    assert result.returncode == 1
    assert "tests.bad_lease" in result.stderr and "not longer than its hard timeout" in result.stderr


def test_notify_wakes_an_idle_worker_at_once(worker):
    proc = worker("listener", "--concurrency", "1", "--poll-interval", "30")
    wait_for(lambda: past_first_lease(proc), timeout=60, what="the worker idle past its first lease")
    item = get_task(PROBE).enqueue({}).id
    run = wait_for(lambda: ExecutionLog.objects.filter(item_id=item).first(), timeout=60, what="the run")
    # Its next poll is 30 s after that lease: only the notification can have started the item sooner. (How much
    # sooner, the enqueue-to-start latency, is queue_bench's to measure.)
    assert (run.executed_at - QueueItem.objects.get(id=item).created_at).total_seconds() < 30
    proc.terminate()
    assert finish(proc, timeout=30) == 0


def wake_lock_holders() -> list[str]:
    """The workers holding a wake duty (a leader row, engine/leaders.py) in this database, expired rows aside."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        rows = conn.execute("SELECT holder FROM queue_app_leader WHERE duty LIKE 'wake %%' AND expires_at > now()")
        return [holder for (holder,) in rows.fetchall()]


def test_one_idle_worker_answers_a_notification_first_and_the_others_follow(worker):
    """No thundering herd: one worker holds the wake duty and leases at once; the others lease a moment later,
    so every idle worker still gets work when there is enough of it (no 30-second poll in between)."""
    procs = [
        worker(f"herd{n}", "--concurrency", "1", "--prefetch", "0", "--poll-interval", "30", "--no-scheduler")
        for n in range(3)
    ]
    # Every worker idle in select(), past its first lease.
    wait_for(lambda: all(past_first_lease(proc) for proc in procs), timeout=60, what="3 workers past a lease")
    wait_for(lambda: len(wake_lock_holders()) == 1, timeout=10, what="one worker to hold the wake duty")
    items = [get_task(PROBE).enqueue({"sleep": 3}).id for _ in range(3)]
    wait_for(lambda: ExecutionLog.objects.filter(item_id__in=items).count() == 3, timeout=60, what="3 runs")
    runs = list(ExecutionLog.objects.filter(item_id__in=items))
    assert sorted(run.worker_id for run in runs) == ["herd0", "herd1", "herd2"]  # one each
    created = dict(QueueItem.objects.filter(id__in=items).values_list("id", "created_at"))
    # Nobody waited for a poll (30 s after its last lease); how soon they started is queue_bench's to measure.
    assert max((run.executed_at - created[run.item_id]).total_seconds() for run in runs) < 30
    assert len(wake_lock_holders()) == 1
    for proc in procs:
        proc.terminate()
    for proc in procs:
        assert finish(proc, timeout=30) == 0
    assert wake_lock_holders() == []  # a stopped worker hands its duty back


@pytest.mark.parametrize("hold", ["0.025", "0"])
def test_a_burst_is_shared_between_workers_unless_told_to_hold_their_whole_prefetch(worker, hold):
    """--prefetch 100 beside --concurrency 2: by default a worker holds only about --hold seconds of work at its
    pace (never less than --concurrency), so the burst the first worker is woken for is shared with the other;
    with --hold 0 the first worker leases it whole and the other has nothing to do."""
    args = ("--pool", "thread", "--concurrency", "2", "--prefetch", "100", "--hold", hold, "--no-scheduler")
    procs = [worker(f"share{n}", *args) for n in range(2)]
    # Both idle in select(), past their first lease.
    wait_for(lambda: all(past_first_lease(proc) for proc in procs), timeout=60, what="2 workers past a lease")
    wait_for(lambda: len(wake_lock_holders()) == 1, timeout=10, what="one worker to hold the wake duty")
    items = engine.enqueue_many(PROBE, [{"sleep": 0.05}] * 60)
    wait_for(lambda: ExecutionLog.objects.filter(item_id__in=items).count() == 60, timeout=60, what="60 runs")
    runs = Counter(ExecutionLog.objects.filter(item_id__in=items).values_list("worker_id", flat=True))
    for proc in procs:
        proc.terminate()
    for proc in procs:
        assert finish(proc, timeout=30) == 0
    per_item = runs_per_item()
    assert sum(runs.values()) == 60 and all(per_item[item] == 1 for item in items)
    if hold == "0":
        assert max(runs.values()) == 60, runs  # leased whole by the first worker woken
    else:
        assert min(runs["share0"], runs["share1"]) >= 15, runs  # each did a good part of it


def test_when_the_first_worker_stops_a_follower_takes_over(worker):
    """The first worker hands its wake duty back as it stops (a leader row: no session lock that a pooler could
    keep); a follower takes it at its next try (its poll interval), and answers the next notification."""
    procs = {f"follow{n}": worker(f"follow{n}", "--concurrency", "1", "--poll-interval", "0.2") for n in range(2)}
    wait_for(lambda: len(wake_lock_holders()) == 1, timeout=30, what="one worker to hold the wake duty")
    (first,) = wake_lock_holders()
    procs[first].terminate()
    assert finish(procs.pop(first), timeout=30) == 0
    (other,) = procs
    wait_for(lambda: wake_lock_holders() == [other], timeout=10, what="the other worker to take the duty")
    item = get_task(PROBE).enqueue({}).id  # and the worker still answers
    wait_for(lambda: ExecutionLog.objects.filter(item_id=item).exists(), timeout=10, what="the run")
    procs[other].terminate()
    assert finish(procs[other], timeout=30) == 0


def test_cancelling_a_running_item_stops_its_handler(worker):
    item = get_task(PROBE).enqueue({"sleep": 60}).id
    proc = worker("canceller", "--concurrency", "1")
    wait_for(lambda: ExecutionLog.objects.filter(item_id=item).exists(), timeout=30, what="the handler to start")
    services.cancel_items([item])
    wait_for(lambda: Worker.objects.get(id="canceller").stats.get("stale") == 1, timeout=10, what="the handler stopped")
    proc.terminate()
    assert finish(proc, timeout=5) == 0  # nothing left in flight to wait for
    assert QueueItem.objects.get(id=item).state == ItemState.CANCELLED


def test_queue_concurrency_limit_holds_across_workers(worker):
    """Two --burst workers of three slots on a queue limited to one: at no sampled instant more than one live
    lease (the limit is on the leases, not on when handlers start), each item leased once, and both workers exit
    by themselves once nothing is ready or in flight."""
    engine.ensure_queue("limited")
    services.set_queue_options("limited", concurrency_limit=1)
    items = get_task(PROBE).enqueue_many([{"sleep": 0.2}] * 6, queue="limited")
    live = LiveReservations("limited")
    live.start()
    try:
        procs = [worker(f"lim{n}", "--burst", "--concurrency", "3", "--queues", "limited") for n in range(2)]
        for proc in procs:  # --burst: each exits by itself once nothing is ready or in flight
            assert finish(proc, timeout=120) == 0, output(proc)[-3000:]
    finally:
        live.stop()
    assert open_items() == 0
    assert sorted(Reservation.objects.filter(item_id__in=items).values_list("item_id", "outcome")) == [
        (item, "done") for item in sorted(items)
    ]
    assert live.most == 1, (live.most, live.samples)  # reached, and never exceeded at any sampled instant


def test_the_loop_goes_on_while_its_lease_statement_waits_on_the_server(worker):
    """The settle-and-lease statement runs on the worker's lease thread (worker/leasing.py): while it waits on the
    server (here on a flow-controlled queue's row lock, held by another connection), the loop still stops a
    handler past its hard timeout and settles it; once the lock goes, the waiting lease returns its item, which
    runs. With the statement in the loop's own thread, the timeout would wait for the lock."""
    services.configure_queue("held", concurrency_limit=5)
    stuck = get_task("tests.sleepy_once").enqueue({"seconds": 30}).id  # hard timeout 5 s, one attempt
    proc = worker("leaser", "--pool", "process", "--concurrency", "1", "--queues", "default", "held")
    wait_for(
        lambda: QueueItem.objects.get(id=stuck).state == ItemState.RESERVED, timeout=60, what="the sleepy item's lease"
    )
    with engine.dedicated_connection() as lock:
        lock.execute("BEGIN")
        # The lock a leaser of the queue takes (sql.LOCK_FLOW_QUEUE), which lets an enqueue into it through.
        lock.execute("SELECT 1 FROM queue_app_queue WHERE name = 'held' FOR NO KEY UPDATE")
        waiting = get_task("queue_app.echo").enqueue({"after": "the lock"}, queue="held").id

        def blocked() -> int:
            return len(blocked_by(lock.info.backend_pid))

        wait_for(blocked, timeout=10, what="the worker's lease to wait on the queue's row lock")
        blocked_at = lock.execute("SELECT clock_timestamp()").fetchone()[0]
        wait_for(
            lambda: [r.outcome for r in Reservation.objects.filter(item_id=stuck)] == ["timed_out"],
            timeout=20,
            what="the hard timeout to be enforced and settled while the lease waits",
        )
        # With tests.sleepy's 1 s, a loaded CI machine once took longer than that from the lease to the lock
        # waited on: the item timed out first, was retried and leased again, and the test waited in vain.
        (timed_out,) = Reservation.objects.filter(item_id=stuck)
        assert timed_out.finished_at > blocked_at, "the hard timeout came before the lease waited on the lock"
        assert blocked(), "the lease should still be waiting on the lock"
        assert QueueItem.objects.get(id=waiting).state == ItemState.READY
        lock.execute("ROLLBACK")
    wait_for(
        lambda: QueueItem.objects.get(id=waiting).state == ItemState.DONE, timeout=10, what="the waiting item to run"
    )
    assert QueueItem.objects.get(id=waiting).result == {"after": "the lock"}
    proc.terminate()
    assert finish(proc, timeout=30) == 0, output(proc)


# -- a database restart under a working worker ----------------------------------------------------------------


def _server_user() -> str:
    user = embedded_pg.server_os_user()
    if user is None:
        pytest.fail("running as root with no `postgres` or `pgserver` OS user to run a PostgreSQL server as")
    return user


def _as_postgres(*cmd: str) -> list[str]:
    """Run PostgreSQL's tools as the server's OS user when we are root."""
    return ["runuser", "-u", _server_user(), "--", *cmd] if os.geteuid() == 0 else list(cmd)


@pytest.fixture
def private_cluster():
    """A PostgreSQL cluster owned by this test, so it may restart it. Yields its DATABASE_URL and data dir. Its
    binaries are the embedded cluster's (the pgserver wheel's, else the machine's): wherever the tests run."""
    bindirs = embedded_pg.server_bindirs()
    if not bindirs:
        pytest.skip("no PostgreSQL server binaries (the pgserver wheel, or pg_ctl/initdb) on this machine")
    bindir = bindirs[0]
    datadir = Path(tempfile.mkdtemp(prefix="jobsite-restart-"))
    if os.geteuid() == 0:
        shutil.chown(datadir, _server_user(), _server_user())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pg_ctl = [f"{bindir}/pg_ctl", "-D", str(datadir / "data"), "-l", str(datadir / "log"), "-w"]
    subprocess.run(
        _as_postgres(f"{bindir}/initdb", "-D", str(datadir / "data"), "-U", "postgres", "-A", "trust", "--no-sync"),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_postgres(*pg_ctl, "-o", options, "start"), check=True, capture_output=True)
    try:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE restart_test")
        yield {"url": f"postgres://postgres@127.0.0.1:{port}/restart_test", "pg_ctl": pg_ctl}
    finally:
        subprocess.run(_as_postgres(*pg_ctl, "-m", "immediate", "stop"), capture_output=True)
        shutil.rmtree(datadir, ignore_errors=True)


def test_worker_rides_out_a_database_restart_and_finishes(manage, worker, private_cluster):
    env = {"DATABASE_URL": private_cluster["url"]}
    for command in (["migrate", "-v", "0"], ["enqueue", PROBE, "--count", "1000"]):
        result = manage(*command, env=env)
        assert result.returncode == 0, result.stderr
    proc = worker("restarted", "--concurrency", "2", env=env)
    conninfo = private_cluster["url"].replace("postgres://", "postgresql://", 1)

    def count(sql: str) -> int:
        try:
            with psycopg.connect(conninfo) as conn:
                return conn.execute(sql).fetchone()[0]
        except psycopg.OperationalError:  # the server is restarting
            return -1

    wait_for(lambda: count("SELECT count(*) FROM queue_app_executionlog") >= 150, timeout=60, what="work to start")
    subprocess.run(_as_postgres(*private_cluster["pg_ctl"], "-m", "fast", "restart"), check=True, capture_output=True)
    wait_for(
        # the probes only: the shipped schedules (migrate made them) queue items of their own
        lambda: count(f"SELECT count(*) FROM queue_app_queueitem WHERE state = 'done' AND task = '{PROBE}'") == 1000,
        timeout=120,
        what="every item done after the restart",
        interval=0.5,
    )
    assert proc.poll() is None  # it did not crash
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    log = output(proc)
    assert "database unavailable" in log and "database back" in log
    assert count("SELECT count(DISTINCT item_id) FROM queue_app_executionlog") == 1000


def test_a_killed_workers_long_lease_comes_back_when_its_heartbeat_goes_stale_not_at_its_deadline(worker):
    item = get_task("tests.long_lease").enqueue({"seconds": 300})
    quick = {"JOBSITE_WORKER_LOST_AFTER": "3"}  # both workers beat every second; silence for 3 s means lost
    victim = worker("victim-long", "--concurrency", "1", env=quick)
    wait_for(lambda: held_by("victim-long") == {item.id}, timeout=30, what="the victim to hold the item")
    # The worker stretches a fresh lease to the task's 700 s right after leasing: wait for that.
    long_from_now = timezone.now() + timedelta(seconds=600)
    wait_for(lambda: QueueItem.objects.get(id=item.id).visible_at > long_from_now, timeout=30, what="the long lease")
    deadline = QueueItem.objects.get(id=item.id).visible_at
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = time.monotonic()
    rescuer = worker("rescuer", "--concurrency", "1", env=quick)
    wait_for(lambda: held_by("rescuer") == {item.id}, timeout=30, what="the rescuer to take the item over")
    taken_after = time.monotonic() - killed_at
    rescuer.send_signal(signal.SIGKILL)
    rescuer.wait(10)
    victims = Reservation.objects.get(item_id=item.id, worker_id="victim-long")
    assert taken_after < 30
    assert victims.outcome == "expired"
    assert (deadline - victims.finished_at).total_seconds() > 600  # long before its lease would have run out
    # The rescuer's own lease was never taken from it while it lived: one attempt each.
    assert list(Reservation.objects.filter(item_id=item.id).order_by("id").values_list("worker_id", flat=True)) == [
        "victim-long",
        "rescuer",
    ]


def runnable_seconds(pid: int) -> float:
    """Seconds the process's main thread (the supervisor's loop) has been on a CPU or waiting for one
    (/proc/PID/schedstat: time on the CPU, time runnable on a run queue): a loop that never blocks is runnable
    all the time, however loaded the machine, while a loop waiting in select() is not."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return (int(on_cpu) + int(waiting)) / 1e9


def test_a_worker_whose_slots_are_all_busy_sleeps_instead_of_spinning(worker):
    """Past its poll time with no free slot, the supervisor must wait in select() for the pool, not loop."""
    item = get_task(PROBE).enqueue({"sleep": 4}).id  # within the probe's hard timeout (5 s)
    proc = worker("busy", "--concurrency", "1", "--prefetch", "0", "--poll-interval", "0.2")
    wait_for(lambda: ExecutionLog.objects.exists(), timeout=30, what="the handler to start")
    before, since = runnable_seconds(proc.pid), time.monotonic()
    # While the handler sleeps, the loop's poll comes due every 0.2 s with no slot to lease for.
    wait_for(lambda: QueueItem.objects.get(id=item).state == ItemState.DONE, timeout=60, what="the handler's end")
    runnable, elapsed = runnable_seconds(proc.pid) - before, time.monotonic() - since
    assert runnable < elapsed / 2, (runnable, elapsed)  # a busy loop is runnable all of the ~4 s
    proc.terminate()
    assert finish(proc, timeout=30) == 0
