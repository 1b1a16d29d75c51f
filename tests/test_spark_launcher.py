"""The launcher against real spark-submit children: progress while running, metrics at the end, cancel,
timeout, and a run on a real standalone cluster (master and worker started from pyspark's own jars).

One spark-submit at a time (the machine has two cores and other suites run beside this one).
"""

import contextlib
import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from queue_app.models import Reservation
from queue_app.spark.db import postgres_source
from queue_app.spark.launcher import launch
from queue_app.spark.session import spark_home
from queue_app.spark.watch import group_members
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
    assert result.outcome == "timed_out", result.log_tail
    assert result.error.startswith("timed out")
    # Stopped at its timeout (SIGTERM, SIGKILL after the grace), long before its 200 s of tasks would end; the
    # margin is for a loaded machine, where the driver may not even have started by then.
    assert 15 <= result.duration < 15 + 5 + 15
    assert result.pgid is not None and group_members(result.pgid) == []  # its whole process group was stopped


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Cluster:
    url: str  # spark://127.0.0.1:PORT
    master_ui: int  # the master's web UI port: /json/ lists workers and applications
    worker_ui: int  # the worker's: /json/ lists the executors it runs
    logs: Path  # master.log, worker.log, and the worker's directory (each executor's stdout and stderr)

    def said(self, chars: int = 3000) -> str:
        """What the cluster said, for a failure's message: the tails of the master's and the worker's logs and
        of each executor's stderr."""
        return said_by(self.logs, chars)


def said_by(logs: Path, chars: int = 3000) -> str:
    files = [logs / "master.log", logs / "worker.log", *sorted((logs / "work").glob("*/*/stderr"))]
    return "".join(
        f"\n--- {path.relative_to(logs)} ---\n{path.read_text(errors='replace')[-chars:]}"
        for path in files
        if path.exists()
    )


def bound_port(log: Path, service: str) -> int | None:
    """The port Spark's `service` bound, from its log ("Successfully started service 'X' on port N"), else None."""
    found = re.search(rf"Successfully started service '{service}' on port (\d+)", log.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def wait_for_port(proc: subprocess.Popen, log: Path, service: str, logs: Path) -> int:
    deadline = time.monotonic() + CLUSTER_START
    while (port := bound_port(log, service)) is None:
        assert proc.poll() is None, f"the {service} daemon exited with {proc.returncode}:{said_by(logs)}"
        assert time.monotonic() < deadline, f"no {service} port after {CLUSTER_START:.0f} s:{said_by(logs)}"
        time.sleep(0.2)
    return port


CLUSTER_START = 300.0  # seconds for a daemon to bind its ports: minutes on a loaded 2-core machine, not a bound


@pytest.fixture
def standalone_cluster(tmp_path):
    """A Spark standalone master and one worker (1 core, 1 GB) on loopback, from pyspark's own jars.

    Every port is bound by the daemon itself (port 0) and read back from its log: a port picked here and bound
    by a JVM seconds later could be taken in between on a busy machine (Spark then binds the next one up, and
    the worker would knock at a port nobody serves)."""
    env = {
        **os.environ,
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_DAEMON_JAVA_OPTS": FAST_JVM["spark.driver.extraJavaOptions"],  # C1 and the serial GC: a quick start
    }
    spark_class = os.path.join(spark_home(), "bin", "spark-class")
    with contextlib.ExitStack() as stack:

        def start(name: str, *args: str) -> subprocess.Popen:
            log = stack.enter_context(open(tmp_path / f"{name}.log", "w"))
            cmd = [spark_class, *args, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            stack.callback(stop_group, proc)  # LIFO: the worker stops before the master
            return proc

        master = start("master", "org.apache.spark.deploy.master.Master")
        url = f"spark://127.0.0.1:{wait_for_port(master, tmp_path / 'master.log', 'sparkMaster', tmp_path)}"
        master_ui = wait_for_port(master, tmp_path / "master.log", "MasterUI", tmp_path)
        worker = start("worker", "org.apache.spark.deploy.worker.Worker", url, "--cores", "1", "--memory", "1g")
        worker_ui = wait_for_port(worker, tmp_path / "worker.log", "WorkerUI", tmp_path)
        deadline = time.monotonic() + CLUSTER_START
        while not alive_workers(master_ui):
            assert worker.poll() is None, f"the worker exited with {worker.returncode}:{said_by(tmp_path)}"
            assert time.monotonic() < deadline, f"the worker did not register:{said_by(tmp_path)}"
            time.sleep(0.5)
        yield Cluster(url, master_ui, worker_ui, tmp_path)


def alive_workers(ui_port: int) -> int:
    return ui_json(ui_port).get("aliveworkers", 0)


def ui_json(ui_port: int) -> dict:
    """A standalone master's or worker's state from its web UI's /json/ ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=10) as resp:
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
