"""A job's concurrency limit holds across real workers: three runs of a job limited to one, triggered at once,
served by two worker processes with two slots each, run one after another; the ones behind show as waiting.
And a failing run is retried as its policy says, after its own backoff, then ends failed."""

import time

import pytest

from queue_app.conf import queue_settings
from queue_app.models import ItemState, QueueItem, Reservation
from queue_app.spark.models import SparkRun, SparkScript
from queue_app.spark.runs import trigger_run, waiting_for
from queue_app.spark.scripts import ROOTS_ENV, save_script
from tests.support.paths import SPARK_SCRIPTS
from tests.support.spark_fixtures import require_spark
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SCRIPTS = SPARK_SCRIPTS
WORKER_ENV = {
    ROOTS_ENV: str(SCRIPTS),
    "SPARK_MASTER": "local[1]",
    "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "JOBSITE_SPARK_STOP_GRACE": "3",
}


@pytest.fixture(autouse=True)
def _roots(monkeypatch):
    require_spark()
    monkeypatch.setenv(ROOTS_ENV, str(SCRIPTS))


def workers(spawn, n=2, concurrency=2):
    for _ in range(n):
        spawn(
            "run_worker",
            "--queues",
            "spark",
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            "0.3",
            env=WORKER_ENV,
        )


def test_three_runs_triggered_at_once_against_a_limit_of_one_run_one_at_a_time(spawn):
    save_script(
        SparkScript(name="slow_limited", path=str(SCRIPTS / "slow.py"), args=["1", "3"], policy={"max_concurrent": 1}),
        actor="test",
    )
    runs = [trigger_run("slow_limited", {}, trigger="orm") for _ in range(3)]
    workers(spawn)
    most_at_once, waiting_seen = 0, set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rows = list(SparkRun.objects.filter(id__in=[r.id for r in runs]))
        started = [r for r in rows if r.state in ("starting", "running", "cancelling")]
        most_at_once = max(most_at_once, len(started))
        waiting_seen |= {r.id for r in rows if waiting_for(r) is not None}
        if all(r.is_final for r in rows):
            break
        time.sleep(0.2)
    rows = sorted(SparkRun.objects.filter(id__in=[r.id for r in runs]), key=lambda r: r.started_at)
    assert [r.state for r in rows] == ["succeeded"] * 3, [(r.state, r.error) for r in rows]
    assert most_at_once == 1
    assert all(a.finished_at <= b.started_at for a, b in zip(rows, rows[1:], strict=False))  # never overlapped
    assert len(waiting_seen) >= 2  # the two behind the first showed as waiting


def test_a_failing_run_is_retried_after_its_jobs_backoff_then_fails(spawn):
    # The job's backoff (4 s, capped at 4 s) replaces the settings' (1 s ± 20 % after a first failure).
    policy = {"attempts": 2, "backoff_base": 4, "backoff_max": 4}
    save_script(SparkScript(name="failing_retried", path=str(SCRIPTS / "failing.py"), policy=policy), actor="test")
    run = trigger_run("failing_retried", {}, trigger="orm")
    workers(spawn, n=1, concurrency=1)
    ended = wait_for(lambda: (r := SparkRun.objects.get(id=run.id)).is_final and r, 240, what="the run to end")
    assert ended.state == "failed" and ended.attempt == 2
    assert ended.error == "ValueError: bad input: expected 11 rows, found 10"
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.DEAD
    first, second = Reservation.objects.filter(item_id=run.item_id).order_by("attempt")
    assert (first.attempt, first.outcome, second.attempt) == (1, "retry", 2)
    # Both times are the database's: the failed settle put the item back at now() + the backoff, which is at
    # least 4 s less the queue's jitter; the second lease cannot come sooner.
    jitter = queue_settings.BACKOFF_JITTER
    assert (second.reserved_at - first.finished_at).total_seconds() >= 4 * (1 - jitter)
