"""The README's Guarantees that rest on several processes, each proved with several real `run_worker` processes
(or enqueuers) on one database: a worker cut off from the database past the silence limit, a hard timeout while
another worker competes for the queue, dedup across processes, the scheduler's fire-once inside real workers.

Connection loss is real: the worker under test reaches PostgreSQL through the chaos run's TCP proxy
(`db_proxy`), which resets its connections and refuses new ones for as long as the test says.
"""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db.models import Count
from django.utils import timezone

from queue_app import engine, scheduling, services
from queue_app.models import (
    ExecutionLog,
    ItemState,
    ProbeEffect,
    QueueItem,
    Reservation,
    Schedule,
    ScheduleFire,
)
from queue_app.registry import get_task
from tests.conftest import ROOT, child_env
from tests.support.waiting import wait_for
from tests.support.worker_helpers import finish, held_by, output, runs_per_item

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LOST_AFTER = "3"  # seconds of silence before a worker is presumed dead (workers then beat every second)


def test_a_worker_cut_off_past_the_silence_limit_sees_its_items_run_elsewhere_and_its_late_settles_are_stale(
    worker, db_proxy
):
    engine.ensure_queue("default")
    services.set_queue_options("default", lease_timeout=60.0)  # far longer than the test: only silence frees them
    plain = get_task("queue_app.probe").enqueue({"sleep": 2})
    txn = get_task("queue_app.probe_transactional").enqueue({"sleep": 2})
    quick = {"JOBSITE_WORKER_LOST_AFTER": LOST_AFTER}
    cut_off = worker("cut-off", "--concurrency", "2", "--prefetch", "0", env=quick | {"DATABASE_URL": db_proxy.url()})
    wait_for(
        lambda: ExecutionLog.objects.filter(worker_id="cut-off").count() == 2,
        timeout=60,
        what="both handlers to start in the worker behind the proxy",
    )
    assert held_by("cut-off") == {plain.id, txn.id}
    # Cut off at once, before its handlers (2 s) finish: they finish while it cannot reach the database. Long
    # enough for a rescuer started now (on a loaded machine, seconds) to see it silent, take its items and run them;
    # reopened as soon as it has.
    assert db_proxy.cut(30) > 0
    rescuer = worker("rescuer", "--concurrency", "2", env=quick)
    wait_for(
        lambda: QueueItem.objects.filter(id__in=[plain.id, txn.id], state=ItemState.DONE).count() == 2,
        timeout=60,
        what="the rescuer to run both items",
    )
    assert db_proxy.refusing(), "the items should have run elsewhere while the first worker was still cut off"
    db_proxy.cut(0)  # the database is reachable again: the rest of the 30 s would only wait
    rescuers = {r.item_id: r for r in Reservation.objects.filter(worker_id="rescuer")}
    assert set(rescuers) == {plain.id, txn.id}
    # Back online, the cut-off worker settles what its handlers finished: stale, it changes nothing.
    wait_for(
        lambda: f"stale item={plain.id} " in output(cut_off) and f"item={txn.id} " in output(cut_off),
        timeout=60,
        what="the cut-off worker's late settle, and the end of its transactional attempt",
    )
    for item in (plain, txn):
        assert QueueItem.objects.get(id=item.id).state == ItemState.DONE
        firsts = Reservation.objects.get(item_id=item.id, worker_id="cut-off")
        assert firsts.outcome == "expired"  # taken back for its worker's silence, never settled by it
        assert rescuers[item.id].outcome == "done"
    assert runs_per_item() == {plain.id: 2, txn.id: 2}  # at-least-once: both ran twice ...
    (effect,) = ProbeEffect.objects.filter(key=str(txn.id)).values_list("applied", flat=True)
    assert effect == 1  # ... but the transactional run that lost its lease rolled back its write
    for proc in (cut_off, rescuer):
        proc.terminate()
        assert finish(proc, timeout=30) == 0, output(proc)[-3000:]


def test_a_hard_timeout_kills_the_handler_while_another_worker_competes_and_the_retry_runs_once(worker):
    engine.ensure_queue("default")
    services.set_queue_options("default", lease_timeout=1.0)  # the task's hard timeout + margin decides
    stuck = get_task("tests.sleepy").enqueue({"seconds": 60})  # hard timeout 1 s, 2 attempts
    probes = get_task("queue_app.probe").enqueue_many([{"sleep": 0.01}] * 200)
    first = worker("first", "--concurrency", "2")
    second = worker("second", "--concurrency", "2")
    wait_for(
        lambda: (
            QueueItem.objects.get(id=stuck.id).state == ItemState.DEAD
            and QueueItem.objects.filter(id__in=probes, state=ItemState.DONE).count() == len(probes)
        ),
        timeout=90,
        what="the stuck item to time out twice and every probe to be done",
    )
    attempts = list(Reservation.objects.filter(item_id=stuck.id).order_by("id"))
    # Each attempt was killed at its hard timeout and recorded so; none lost its lease to the competing worker
    # while its handler lived (that would say "expired"), and the retry began only after the kill.
    assert [a.outcome for a in attempts] == ["timed_out", "timed_out"]
    assert attempts[1].reserved_at >= attempts[0].finished_at
    assert all((a.finished_at - a.reserved_at).total_seconds() < 10 for a in attempts)  # not its 60 s sleep
    assert set(runs_per_item().values()) == {1} and len(runs_per_item()) == len(probes)
    assert not ProbeEffect.objects.exclude(applied=1).exists()
    for proc in (first, second):
        assert proc.poll() is None, output(proc)[-3000:]  # a killed handler never takes its worker down
        proc.terminate()
        assert finish(proc, timeout=30) == 0


ENQUEUE_ONE = """
import json, sys, django
django.setup()
from queue_app import engine
print("ready", flush=True)
sys.stdin.readline()  # every process waits at the line, then all enqueue at once
result = engine.enqueue("queue_app.echo", {"by": sys.argv[1]}, dedup_key="nightly-report")
print(json.dumps({"id": result.id, "duplicate": result.duplicate}))
"""


def test_dedup_holds_across_processes_enqueueing_the_same_key_at_once(test_db_name):
    engine.ensure_queue("default")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ENQUEUE_ONE, str(n)],
            cwd=ROOT,
            env=child_env(test_db_name),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(6)
    ]
    for proc in procs:  # every one set up and waiting
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [proc.communicate(timeout=120) for proc in procs]
    answers = []
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err[-3000:]
        answers.append(json.loads(out.strip().splitlines()[-1]))
    assert len({a["id"] for a in answers}) == 1  # one item for the key, whoever won
    assert sorted(a["duplicate"] for a in answers) == [False] + [True] * 5  # and exactly one enqueuer made it
    assert QueueItem.objects.filter(dedup_key="nightly-report").count() == 1


def test_three_workers_fire_each_due_schedule_exactly_once(worker):
    now = timezone.now()
    due_time = scheduling.latest_fire_at_or_before("* * * * *", "UTC", now)  # the minute that just began
    schedules = [
        Schedule.objects.create(
            name=f"every-minute-{n}",
            cron="* * * * *",
            target="queue_app.probe",
            payload={},
            catch_up="once",
            next_fire_at=due_time,
        )
        for n in range(5)
    ]
    workers = [worker(f"sched{n}", "--concurrency", "1") for n in range(3)]
    # Every fire of these schedules. Which minutes they are depends on when the workers' first scheduler round
    # runs: a start slowed past the next minute fires that minute instead of due_time (catch_up "once": the
    # latest due time, once), and a long test sees later minutes come due. Each (schedule, minute) must fire once.
    fires = ScheduleFire.objects.filter(schedule__in=schedules)

    def fired_and_ran() -> bool:
        firsts = fires.order_by("schedule_id", "fire_at").distinct("schedule_id").values("item_id")
        done = QueueItem.objects.filter(id__in=firsts, state=ItemState.DONE).count()
        return done >= len(schedules)

    try:
        wait_for(
            fired_and_ran,
            # A bound on three workers' start-up and one scheduler round, not a speed goal: 60 s ran out once in
            # a full suite on a slow VM (passing 6 of 6 alone there, 8-10 s each).
            timeout=120,
            what="every schedule to fire and its item to run",
        )
    except AssertionError as exc:  # say what the workers were doing
        fired = list(ScheduleFire.objects.values_list("schedule_id", "fire_at", "item_id"))
        logs = "\n".join(f"--- {proc.log.name}\n{output(proc)[-2000:]}" for proc in workers)
        raise AssertionError(f"{exc}; fires: {fired}\n{logs}") from None
    # More scheduler rounds, after every fire was made: a second fire of a due time would show in them. A marker
    # schedule due now, created once the one before it fired, is fired by a round that began after that.
    for n in range(len(workers)):
        marker = Schedule.objects.create(
            name=f"marker-{n}", cron="* * * * *", target="queue_app.noop", payload={}, next_fire_at=due_time
        )
        wait_for(lambda m=marker: ScheduleFire.objects.filter(schedule=m).exists(), timeout=60, what="a later round")
    for proc in workers:  # stopped cleanly: what they leased is settled
        proc.terminate()
        assert finish(proc, timeout=30) == 0, output(proc)[-3000:]
    per_time = fires.values("schedule_id", "fire_at").annotate(n=Count("id"))
    assert {f["schedule_id"] for f in per_time} == {s.id for s in schedules}
    assert [f for f in per_time if f["n"] != 1] == []  # each schedule's each due time fired once
    fired = list(fires.values_list("item_id", flat=True))
    assert None not in fired and len(set(fired)) == len(fired)  # each fire its own item
    runs = runs_per_item()
    ran = QueueItem.objects.filter(id__in=fired, state=ItemState.DONE).values_list("id", flat=True)
    assert len(ran) >= len(schedules)
    assert {item_id: runs[item_id] for item_id in ran} == {item_id: 1 for item_id in ran}  # and ran once


CLOCK_NANOSLEEP = {"x86_64": "230", "aarch64": "115"}[os.uname().machine]  # time.sleep's system call on Linux


def _children_asleep(proc) -> int:
    """How many of a worker's pool children are in time.sleep (their system call, from /proc)."""
    asleep = 0
    for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
        with contextlib.suppress(OSError):  # gone meanwhile
            asleep += Path(f"/proc/{child}/syscall").read_text().split()[0] == CLOCK_NANOSLEEP
    return asleep


def test_a_worker_cut_off_briefly_settles_what_finished_meanwhile_once_the_database_is_back(worker, db_proxy):
    """README, limits: results of handlers that finish while the database is unreachable are kept and settled
    when it is back. Inside the silence limit nobody takes the items over: each runs once, settled by it."""
    engine.ensure_queue("default")
    services.set_queue_options("default", lease_timeout=60.0)
    ids = get_task("queue_app.probe").enqueue_many([{"sleep": 1}] * 4)
    cut_off = worker("blip", "--concurrency", "4", "--prefetch", "0", env={"DATABASE_URL": db_proxy.url()})
    wait_for(lambda: ExecutionLog.objects.count() == 4, timeout=60, what="the four handlers to start")
    # A run's row is visible once the server commits it, before its reply has reached the handler through the
    # proxy: a cut then fails that handler (a loaded CI machine did so, and the retries ran again). Cut once the
    # four are asleep, past their statement.
    wait_for(lambda: _children_asleep(cut_off) == 4, timeout=30, what="the four handlers asleep")
    assert db_proxy.cut(4) > 0  # the handlers finish (1 s) during the cut
    other = worker("bystander", "--concurrency", "2")  # competes for the queue all along: must get nothing
    wait_for(
        lambda: QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == 4,
        timeout=60,
        what="the cut-off worker to settle its items after the cut",
    )
    assert runs_per_item() == dict.fromkeys(ids, 1)
    assert set(Reservation.objects.filter(item_id__in=ids).values_list("worker_id", "outcome")) == {("blip", "done")}
    assert "database unavailable" in output(cut_off)  # it did lose the database meanwhile
    assert "stale item=" not in output(cut_off)
    # Up before it is stopped: SIGTERMed while still importing (a loaded machine), it dies of the signal (-15).
    wait_for(lambda: "worker started" in output(other), timeout=60, what="the bystander to start")
    for proc in (cut_off, other):
        proc.terminate()
        assert finish(proc, timeout=30) == 0, output(proc)[-3000:]
