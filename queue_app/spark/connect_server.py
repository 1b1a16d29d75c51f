"""Running jobsite's Spark Connect server (`manage.py spark_connect_server`): start it with the installed pyspark
on loopback, restart it when it dies (with a backoff), and record its health on its SparkConnectServer row
(connect_health.py) every few seconds. How runs find and talk to the server is connect.py's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

from queue_app.spark import connect, connect_health, session
from queue_app.spark.commandline import child_environment
from queue_app.spark.watch import child_preexec


class Supervisor:
    """Runs the server, restarts it when it dies (with a backoff), and records its health every `interval`."""

    def __init__(self, url: connect.ConnectUrl, *, master: str | None = None, interval: float = 5.0, log=print) -> None:
        self.url, self.master, self.interval, self.log = url, master or session.spark_master(), interval, log
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.backoff, self._started = 1.0, time.monotonic()  # the next restart's wait; the last start
        self.stopping = False
        self.session = None  # the probes' own Connect session

    def start(self) -> None:
        if connect.reachable(self.url):
            raise connect.ConnectConfigError(f"{self.url.host}:{self.url.port} is in use already: pick another port")
        env = child_environment({"SPARK_LOCAL_IP": "127.0.0.1"} if self.master.startswith("local") else {})
        self.proc = subprocess.Popen(
            connect.server_command(self.url, self.master),
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=child_preexec,  # dies with the supervisor
        )
        self.log(f"spark connect server pid {self.proc.pid} starting on {self.url} (master {self.master})")

    def stop(self, grace: float = 10.0) -> None:
        self.stopping = True
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def serve(self, *, until=None) -> None:
        """Supervise until `until()` says stop (or forever). Only the first start's failure ends it (a port in use
        is a configuration error then); later ones are the `step`s' to retry."""
        self.start()
        self._started = time.monotonic()
        while not self.stopping and not (until and until()):
            self.step()
        self.stop()
        connect_health.record(self.url, self.master, pid=None, healthy=False, error="stopped")

    def step(self) -> None:
        """One round: wait, then restart the server if it exited (after a backoff that doubles while it dies
        within a minute of its start), else probe it and record its health. A restart that cannot start the
        server (its port taken meanwhile by another process) is recorded and tried again next round, never given
        up: the supervisor outlives whatever its server meets."""
        up = self.proc is not None and self.proc.poll() is None
        time.sleep(self.interval if up and connect_health.is_healthy(self.url) else 1.0)
        if self.proc is not None and self.proc.poll() is not None:
            error = f"the server exited with code {self.proc.returncode}"
            connect_health.record(self.url, self.master, pid=None, healthy=False, error=error)
            self.log(f"spark connect server: {error}; restarting in {self.backoff:.0f}s")
            self.proc, self.session = None, None
            self.restarts += 1
            connect_health.restarted(self.url)
        if self.proc is None:
            time.sleep(self.backoff)
            quick = time.monotonic() - self._started < 60
            self.backoff = min(self.backoff * 2, 60.0) if quick else 1.0
            self._started = time.monotonic()
            try:
                self.start()
            except (connect.ConnectConfigError, OSError) as exc:
                error = f"cannot restart the server: {exc}"
                connect_health.record(self.url, self.master, pid=None, healthy=False, error=error)
                self.log(f"spark connect server: {error}; trying again in {self.backoff:.0f}s")
            return
        error, self.session = connect.probe(self.url, self.session)
        connect_health.record(self.url, self.master, pid=self.proc.pid, healthy=not error, error=error)
