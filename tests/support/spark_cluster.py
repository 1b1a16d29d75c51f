"""A Spark standalone master and worker on loopback (`standalone_cluster` fixture) from pyspark's own jars, their web
UIs' state, a free port, and stopping a process group."""

import contextlib
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

from queue_app.spark.session import spark_home
from tests.support.spark_fixtures import FAST_JVM


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
