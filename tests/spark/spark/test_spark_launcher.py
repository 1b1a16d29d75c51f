"""The launcher against real spark-submit children: progress while running, metrics at the end, cancel,
timeout, and a run on a real standalone cluster (master and worker started from pyspark's own jars).

One spark-submit at a time (the machine has two cores and other suites run beside this one).
"""

import datetime as dt
import os
import time

import pytest

from queue_app.models import Reservation
from queue_app.spark.db import postgres_source
from queue_app.spark.launcher import launch
from queue_app.spark.watch import group_members
from tests.conftest import child_env
from tests.support import spark_cluster
from tests.support.spark_fixtures import FAST_JVM, require_jdbc_for_tcp, require_spark, seed_queue_history

standalone_cluster = spark_cluster.standalone_cluster  # the fixture

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _spark_available():
    require_spark()


class Recorder:
    """Callbacks of one launch, with when each event arrived."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.progress: list[tuple[float, dict]] = []
        self.logs: list[str] = []
        self.started: dict | None = None
        self.pgid: int | None = None

    def on_progress(self, event):
        self.progress.append((time.monotonic() - self.t0, event))

    def on_log(self, line):
        self.logs.append(line)

    def on_start(self, event):
        self.started = event
        self.pgid = os.getpgid(event["pid"])  # the Python driver shares the run's process group

    def callbacks(self):
        return {"on_progress": self.on_progress, "on_log": self.on_log, "on_start": self.on_start}

    def first_task_at(self):
        return next((t for t, e in self.progress if e["tasks_done"] > 0), None)


def test_a_run_reports_progress_while_running_and_metrics_at_the_end():
    rec = Recorder()
    # Two task slots, six tasks: three waves, so some progress must arrive with tasks done and tasks left.
    result = launch(
        "demo_sleep",
        {"tasks": "6", "seconds": "1.5"},
        run_id="e2e",
        master="local[2]",
        conf=FAST_JVM,
        **rec.callbacks(),
    )
    assert result.outcome == "succeeded", result.log_tail
    assert result.metrics == {"tasks": 6, "sum": 15}
    assert result.app_id.startswith("local-") and result.app_id == rec.started["app_id"]
    mid_run = [e for _, e in rec.progress if 0 < e["tasks_done"] < e["tasks_total"]]
    assert mid_run, rec.progress  # progress arrived while tasks were still running
    assert mid_run[0]["jobs_total"] == 1 and mid_run[0]["active_stages"]
    assert result.progress["tasks_done"] == result.progress["tasks_total"] == 6
    assert any("Spark" in line for line in rec.logs)  # Spark's own log lines are forwarded
    assert group_members(rec.pgid) == []


def test_a_failing_job_ends_failed_with_its_error():
    result = launch("demo_sleep", {"tasks": "1", "seconds": "0", "fail": "true"}, run_id="fail", conf=FAST_JVM)
    assert result.outcome == "failed"
    assert result.error == "RuntimeError: demo_sleep failed on purpose (fail=true)"
    assert "Traceback" in result.log_tail


def test_cancel_stops_the_run_and_its_whole_process_group():
    rec = Recorder()
    asked = []

    def should_cancel():
        if rec.first_task_at() is not None and not asked:
            asked.append(time.monotonic())
        return bool(asked)

    result = launch(
        "demo_sleep",
        {"tasks": "400", "seconds": "1"},
        run_id="cancel",
        conf=FAST_JVM,
        should_cancel=should_cancel,
        grace=10,
        **rec.callbacks(),
    )
    stopped_in = time.monotonic() - asked[0]
    assert result.outcome == "cancelled"
    assert result.error == "cancelled"
    assert group_members(rec.pgid) == []
    assert stopped_in < 10 + 2, "SIGTERM should end the run; SIGKILL comes only after the grace period"
    assert result.progress["tasks_done"] < 400


def test_a_run_past_its_timeout_ends_timed_out():
    rec = Recorder()
    result = launch(
        "demo_sleep",
        {"tasks": "400", "seconds": "1"},
        run_id="timeout",
        conf=FAST_JVM,
        timeout=15,
        grace=5,
        **rec.callbacks(),
    )
    assert result.outcome == "timed_out", result.log_tail
    assert result.error.startswith("timed out")
    # Stopped at its timeout (SIGTERM, SIGKILL after the grace), long before its 200 s of tasks would end; the
    # margin is for a loaded machine, where the driver may not even have started by then.
    assert 15 <= result.duration < 15 + 5 + 15
    assert result.pgid is not None and group_members(result.pgid) == []  # its whole process group was stopped


def test_a_pipeline_runs_on_a_standalone_cluster(standalone_cluster, test_db_name, monkeypatch):
    require_jdbc_for_tcp()
    since = dt.datetime(2025, 3, 10, tzinfo=dt.UTC)
    seed_queue_history(since, items=100)
    monkeypatch.setenv("SPARK_MASTER", standalone_cluster.url)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    result = launch(
        "queue_analytics",
        {"since": "2025-03-10", "until": "2025-03-12", "partitions": "2"},
        run_id=42,
        conf={
            **FAST_JVM,
            "spark.executor.extraJavaOptions": FAST_JVM["spark.driver.extraJavaOptions"],
            "spark.executor.memory": "512m",
            "spark.cores.max": "1",
        },
        env=child_env(test_db_name),
        timeout=900,  # the launcher's stop, far above a run on a loaded machine (2 min at load 13)
    )
    assert result.outcome == "succeeded", (
        f"{result.outcome}: {result.error}\n--- the driver (its stdout and stderr) ---\n{result.log_tail[-6000:]}"
        + standalone_cluster.said()
    )
    assert result.app_id.startswith("app-")  # a standalone application, not local-
    assert result.metrics["reader"] == ("psycopg" if postgres_source().is_socket else "jdbc")
    assert (
        result.metrics["attempts"]
        == Reservation.objects.filter(reserved_at__gte=since, reserved_at__lt=since + dt.timedelta(days=2)).count()
    )
    assert (
        sum(row["processed"] for row in result.outputs["rows"])
        == Reservation.objects.filter(
            outcome="done", reserved_at__gte=since, reserved_at__lt=since + dt.timedelta(days=2)
        ).count()
    )
