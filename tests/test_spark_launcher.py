"""The launcher against real spark-submit children: progress while running, metrics at the end, cancel,
timeout, and a run on a real standalone cluster (master and worker started from pyspark's own jars).

One spark-submit at a time (the machine has two cores and other suites run beside this one).
"""

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from typing import NamedTuple

import pytest

from queue_app.models import Reservation
from queue_app.spark import launch
from queue_app.spark.db import postgres_source
from queue_app.spark.launcher import group_members
from queue_app.spark.session import spark_home
from tests.conftest import child_env
from tests.spark_fixtures import FAST_JVM, require_jdbc_for_tcp, require_spark, seed_queue_history

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
    assert result.outcome == "timed_out"
    assert result.error.startswith("timed out")
    assert 15 <= result.duration < 15 + 5 + 3
    assert rec.pgid is not None  # it started, and then its whole process group was stopped
    assert group_members(rec.pgid) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster(NamedTuple):
    url: str  # spark://127.0.0.1:PORT
    master_ui: int  # the master's web UI port: /json/ lists workers and applications
    worker_ui: int  # the worker's: /json/ lists the executors it runs


@pytest.fixture
def standalone_cluster(tmp_path):
    """A Spark standalone master and one worker (1 core, 1 GB) on loopback, from pyspark's own jars."""
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    env = {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path)}
    spark_class = os.path.join(spark_home(), "bin", "spark-class")
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
    worker = ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g"]
    with contextlib.ExitStack() as stack:
        daemons = []
        for name, args, ui in (("master", master, master_ui), ("worker", worker, worker_ui)):
            log = stack.enter_context(open(tmp_path / f"{name}.log", "w"))
            cmd = [spark_class, *args, "--webui-port", str(ui)]
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            daemons.append(proc)
            stack.callback(stop_group, proc)  # LIFO: the worker stops before the master
        deadline = time.monotonic() + 90
        while not alive_workers(master_ui):
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)
        yield Cluster(url, master_ui, worker_ui)


def alive_workers(ui_port: int) -> int:
    return ui_json(ui_port).get("aliveworkers", 0)


def ui_json(ui_port: int) -> dict:
    """A standalone master's or worker's state from its web UI's /json/ ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return json.load(resp)
    except OSError:
        return {}


def stop_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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
        conf={**FAST_JVM, "spark.executor.memory": "512m", "spark.cores.max": "1"},
        env=child_env(test_db_name),
        timeout=240,
    )
    assert result.outcome == "succeeded", result.log_tail
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
