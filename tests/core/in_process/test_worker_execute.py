"""What runs where the handler runs (worker/execute.py) and the executors (worker/pool.py), in process."""

import os
import signal
import subprocess
import sys
import time

import pytest

from queue_app import engine
from queue_app.models import ItemState, ProbeEffect, QueueItem
from queue_app.probes.tasks import close_log_connection
from queue_app.registry import get_task
from queue_app.worker.execute import Job, own_retry_in, run_job
from queue_app.worker.options import Running
from queue_app.worker.pool import ProcessPool, ThreadPool
from queue_app.worker.settling import Settler
from tests.conftest import ROOT
from tests.support.pool_runner import scripted, scripted_job, wait_outcomes
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks)


@pytest.fixture(autouse=True)
def _close_probe_log_connection():
    yield
    close_log_connection()  # else the test database cannot be dropped at the end


def job_for(lease: engine.Lease) -> Job:
    return Job(
        reservation_id=lease.reservation_id,
        item_id=lease.item_id,
        queue=lease.queue,
        task=lease.task,
        payload=lease.payload,
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        worker_id="test",
    )


def lease_one(task: str, payload=None) -> engine.Lease:
    item = get_task(task).enqueue(payload or {})
    (held,) = engine.lease(None, 1, "test")
    assert held.item_id == item.id
    return held


@pytest.fixture(params=[ProcessPool, ThreadPool], ids=["process", "thread"])
def pool(request):
    pool = request.param(2, scripted)
    pool.start()
    yield pool
    pool.shutdown()


@pytest.mark.django_db(transaction=True)
def test_transactional_handler_and_settle_commit_together():
    held = lease_one("queue_app.probe_transactional")
    outcome = run_job(job_for(held))
    assert outcome.status == "settled"
    assert QueueItem.objects.get(id=held.item_id).state == ItemState.DONE
    assert ProbeEffect.objects.get(key=str(held.item_id)).applied == 1


@pytest.mark.django_db(transaction=True)
def test_transactional_handler_error_rolls_back_its_writes():
    held = lease_one("queue_app.probe_transactional", {"fail": True})
    outcome = run_job(job_for(held))
    assert outcome.status == "failed" and "probe asked to fail" in outcome.error
    assert not ProbeEffect.objects.filter(key=str(held.item_id)).exists()
    assert QueueItem.objects.get(id=held.item_id).state == ItemState.RESERVED  # the supervisor settles the failure


@pytest.mark.django_db(transaction=True)
def test_transactional_handler_does_not_run_on_a_stale_reservation():
    held = lease_one("queue_app.probe_transactional")
    engine.release(held)
    outcome = run_job(job_for(held))
    assert outcome.status == "stale"
    assert not ProbeEffect.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_handler_result_that_is_not_json_fails_the_attempt_with_a_clear_error():
    held = lease_one("tests.not_json")
    outcome = run_job(job_for(held))
    assert outcome.status == "failed"
    assert "result cannot be stored" in outcome.error and "not JSON-serializable" in outcome.error


@pytest.mark.django_db(transaction=True)
def test_exception_in_retry_policy_ignore_list_is_not_retryable():
    held = lease_one("tests.unfixable")
    outcome = run_job(job_for(held))
    assert (outcome.status, outcome.retryable) == ("failed", False)
    assert "Unfixable: retrying cannot help" in outcome.error and "Traceback" in outcome.traceback


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_settles_its_own_item_is_counted_and_settled_by_nobody_else():
    task = get_task("tests.settles_itself")
    settler = Settler(lambda queues: None)
    done = lease_one("tests.settles_itself")
    outcome = run_job(job_for(done))
    assert (outcome.status, outcome.result, outcome.error) == ("settled", {"ok": True}, "")
    assert QueueItem.objects.get(id=done.item_id).state == ItemState.DONE  # with the handler's work
    settler.finish(Running(done, task), outcome)
    failed = lease_one("tests.settles_itself", {"fail": True})
    outcome = run_job(job_for(failed))
    assert (outcome.status, outcome.error, outcome.retryable, outcome.retry_in) == (
        "settled",
        "Boom: asked to",
        True,
        30,
    )
    item = QueueItem.objects.get(id=failed.item_id)
    assert item.state == ItemState.READY and item.error == "Boom: asked to"  # the retry, written by the handler
    settler.finish(Running(failed, task), outcome)
    assert settler.unsettled() == 0 and len(settler.due) == 1  # nothing left to settle; woken when the retry is due
    assert (settler.stats.processed, settler.stats.failed, settler.stats.dead, settler.stats.stale) == (1, 1, 0, 0)


def test_an_exception_may_name_its_own_retry_delay_when_it_is_a_sane_number():
    def raised(value):
        exc = RuntimeError("x")
        exc.retry_in = value
        return exc

    assert own_retry_in(raised(12.5)) == 12.5 and own_retry_in(raised(0)) == 0.0
    assert own_retry_in(RuntimeError("no attribute")) is None  # the task's Retry decides
    for bad in (-1, float("nan"), float("inf"), True, "5", None):
        assert own_retry_in(raised(bad)) is None, bad


@pytest.mark.django_db(transaction=True)
def test_handler_can_extend_its_own_lease():
    held = lease_one("tests.extends", {"seconds": 600})
    outcome = run_job(job_for(held))
    assert outcome.status == "ok"
    item = QueueItem.objects.get(id=held.item_id)
    assert (item.visible_at - held.lease_expires_at).total_seconds() > 300


# -- pools ----------------------------------------------------------------------------------------------------


def test_pool_runs_jobs_and_reports_outcomes(pool):
    pool.submit(scripted_job(1))
    pool.submit(scripted_job(2))
    assert pool.idle() == 0
    outcomes = wait_outcomes(pool, 2)
    assert sorted(o.reservation_id for o in outcomes) == [1, 2]
    assert all(o.status == "ok" for o in outcomes)
    assert pool.idle() == 2


@pytest.mark.parametrize(
    ("action", "expected"),
    [("exit", "exited with code 3"), ("segfault", "killed by SIGSEGV"), ("system_exit", "exited with code 4")],
)
def test_child_that_dies_fails_its_attempt_and_is_replaced(action, expected):
    pool = ProcessPool(1, scripted)
    pool.start()
    try:
        first_pid = pool.children[0].process.pid
        pool.submit(scripted_job(1, do=action))
        (outcome,) = wait_outcomes(pool, 1)
        assert outcome.status == "failed" and expected in outcome.error
        assert pool.children[0].process.pid != first_pid
        pool.submit(scripted_job(2))
        (after,) = wait_outcomes(pool, 1)
        assert after.status == "ok"
    finally:
        pool.shutdown()


def test_thread_pool_reports_system_exit_as_failure_and_keeps_the_thread():
    pool = ThreadPool(1, scripted)
    pool.start()
    try:
        pool.submit(scripted_job(1, do="system_exit"))
        (outcome,) = wait_outcomes(pool, 1)
        assert outcome.status == "failed" and "SystemExit" in outcome.error
        pool.submit(scripted_job(2))
        assert wait_outcomes(pool, 1)[0].status == "ok"
    finally:
        pool.shutdown()


def test_stopping_a_stuck_child_kills_it_and_frees_the_slot():
    pool = ProcessPool(1, scripted)
    pool.start()
    try:
        stuck = pool.children[0].process.pid
        pool.submit(scripted_job(1, do="sleep", seconds=60))
        time.sleep(0.2)
        pool.stop(1)
        assert not alive(stuck)
        assert pool.idle() == 1
        pool.submit(scripted_job(2))
        assert [o.reservation_id for o in wait_outcomes(pool, 1)] == [2]
    finally:
        pool.shutdown()


def test_stopping_a_stuck_thread_abandons_it_and_ignores_its_late_outcome():
    pool = ThreadPool(1, scripted)
    pool.start()
    try:
        pool.submit(scripted_job(1, do="sleep", seconds=0.5))
        pool.stop(1)
        assert pool.idle() == 1
        pool.submit(scripted_job(2))
        outcomes = wait_outcomes(pool, 1)
        time.sleep(0.7)
        outcomes += pool.collect()
        assert [o.reservation_id for o in outcomes] == [2]
    finally:
        pool.shutdown()


def test_warm_ups_run_once_in_each_process_before_its_first_job_and_a_failing_one_is_only_logged(tmp_path, caplog):
    marks = tmp_path / "warm-ups"

    def mark() -> None:
        with marks.open("a") as out:
            out.write(f"{os.getpid()}\n")

    def broken() -> None:
        raise RuntimeError("the warm-up's service is down")

    for pool in (ProcessPool(2, scripted, warm_ups=[broken, mark]), ThreadPool(3, scripted, warm_ups=[mark, broken])):
        marks.write_text("")
        pool.start()
        try:
            for round_ in range(2):
                for n in range(pool.size):
                    pool.submit(scripted_job(10 * round_ + n))
                assert {o.status for o in wait_outcomes(pool, pool.size)} == {"ok"}  # the broken one stopped nothing
            pids = marks.read_text().split()
            if isinstance(pool, ProcessPool):  # once in each child, none in this process
                assert sorted(map(int, pids)) == sorted(c.process.pid for c in pool.children)
            else:  # the threads share their process: once
                assert pids == [str(os.getpid())]
        finally:
            pool.shutdown()
    assert "warm-up" in caplog.text and "the warm-up's service is down" in caplog.text


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever inherited it to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


SUPERVISOR_STANDIN = """
import time
import django
django.setup()
from queue_app.worker.pool import ProcessPool
from tests.support.pool_runner import scripted
pool = ProcessPool(1, scripted)
pool.start()
print(pool.children[0].process.pid, flush=True)
time.sleep(60)
"""


def test_children_die_with_the_supervisor():
    """PR_SET_PDEATHSIG: a child whose supervisor is SIGKILLed does not run on."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings", "JOBSITE_NO_BOOTSTRAP": "1"}
    standin = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR_STANDIN], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        child_pid = int(standin.stdout.readline())
        assert alive(child_pid)
    finally:
        standin.kill()
        standin.wait()
    deadline = time.monotonic() + 5
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(child_pid):
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the pool's child outlived its supervisor")
