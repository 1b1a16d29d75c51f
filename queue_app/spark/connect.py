"""Warm runs: an opt-in Spark Connect server run and supervised by jobsite, and how runs find it.

`manage.py spark_connect_server` starts the server with the installed pyspark (`spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`, pyspark's jars carry it) on loopback only, restarts
it when it dies, and writes its health to a SparkConnectServer row. Setting `JOBSITE_SPARK_CONNECT` (e.g.
`sc://127.0.0.1:15002`; unset: off) makes the launcher run registered functions through that server: each run
is a light Python child with its own Connect session (own temp views and conf), its operations tagged with the
run's tag so cancel interrupts only them. After a warm run the launcher starts a spare light child that gets
ready for the next one (imports, Django, its session opened and that session's Python worker started on the
server): the next run skips about 2 s of start-up. A server that does not answer, or dies mid-run, sends the run to
spark-submit in the same attempt (launcher.py); nothing waits on it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import session

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_PORT = 15002
ENV = "JOBSITE_SPARK_CONNECT"


class ConnectConfigError(ValueError):
    """JOBSITE_SPARK_CONNECT is not a loopback `sc://host:port` URL."""


@dataclass(frozen=True)
class ConnectUrl:
    host: str
    port: int

    def __str__(self) -> str:
        return f"sc://{self.host}:{self.port}"


def parse_url(value: str) -> ConnectUrl:
    """A loopback `sc://host:port` URL; anything else is a clear error (the server has no authentication, so
    jobsite never talks to one off this machine)."""
    parts = urlsplit(value.strip())
    try:
        port = parts.port
    except ValueError as exc:
        raise ConnectConfigError(f"{ENV}={value!r}: bad port ({exc})") from None
    if parts.scheme != "sc" or not parts.hostname or parts.path not in ("", "/") or parts.query or parts.username:
        raise ConnectConfigError(f"{ENV}={value!r}: expected sc://127.0.0.1:PORT")
    if parts.hostname not in LOOPBACK:
        raise ConnectConfigError(f"{ENV}={value!r}: the Spark Connect server must be on loopback (127.0.0.1)")
    return ConnectUrl(parts.hostname, port or DEFAULT_PORT)


def configured() -> ConnectUrl | None:
    """The Connect server runs should use, None when warm runs are off (the default)."""
    value = os.environ.get(ENV, "").strip()
    if not value or value.lower() in ("0", "off", "false", "no"):
        return None
    return parse_url(value)


def reachable(url: ConnectUrl, timeout: float = 0.5) -> bool:
    """Whether something accepts connections on the server's port (the supervisor's probe says it is Spark)."""
    with contextlib.suppress(OSError), socket.create_connection((url.host, url.port), timeout=timeout):
        return True
    return False


def server_command(url: ConnectUrl, master: str | None = None) -> list[str]:
    """spark-submit of the Connect server from the installed pyspark, bound to loopback on the URL's port."""
    conf = session.run_conf("connect-server")
    conf.update(
        {
            "spark.app.name": "jobsite-spark-connect",
            "spark.connect.grpc.binding.address": "127.0.0.1" if url.host != "::1" else "::1",
            "spark.connect.grpc.binding.port": str(url.port),
            # Progress reaches runs every 250 ms (default 2 s): the run page and trigger -> first task see it.
            "spark.connect.progress.reportInterval": "250ms",
        }
    )
    cmd = [
        os.path.join(session.spark_home(), "bin", "spark-submit"),
        "--master",
        master or session.spark_master(),
        "--class",
        SERVER_CLASS,
    ]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + ["spark-internal"]


def open_session(url: ConnectUrl | str):
    """A new Connect session on `url` (its own temp views and conf) whose calls give up within about 3 s once
    the server is gone. The client's default retries last ten minutes: a run would wait that long to fail over,
    and the supervisor's probe, caught mid-query by the server's death, would not see the exit to restart it."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark = SparkSession.builder.remote(str(url)).create()
    spark.client.set_retry_policies([DefaultPolicy(max_retries=4, initial_backoff=100, max_backoff=1000)])
    return spark


def probe(url: ConnectUrl, spark=None):
    """(error, session): error is '' when the server ran a query in `spark` (a session kept between probes,
    opened when None). A failed probe drops its session."""
    if not reachable(url):
        return f"nothing listens on {url.host}:{url.port}", None
    try:
        spark = spark if spark is not None else open_session(url)
    except Exception as exc:  # any client error means: not healthy
        return _said(exc), None
    error = probe_error(spark)
    return error, None if error else spark


def probe_error(spark) -> str:
    """'' when the server of session `spark` runs a query, else what went wrong."""
    try:
        spark.range(1).collect()
    except Exception as exc:
        return _said(exc)
    return ""


def _said(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"


class Supervisor:
    """Runs the server, restarts it when it dies (with a backoff), and records its health every `interval`."""

    def __init__(self, url: ConnectUrl, *, master: str | None = None, interval: float = 5.0, log=print) -> None:
        self.url, self.master, self.interval, self.log = url, master or session.spark_master(), interval, log
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.backoff, self._started = 1.0, time.monotonic()  # the next restart's wait; the last start
        self.stopping = False
        self.session = None  # the probes' own Connect session

    def start(self) -> None:
        from .launcher import _child_preexec, child_environment

        if reachable(self.url):
            raise ConnectConfigError(f"{self.url.host}:{self.url.port} is in use already: pick another port")
        env = child_environment({"SPARK_LOCAL_IP": "127.0.0.1"} if self.master.startswith("local") else {})
        self.proc = subprocess.Popen(
            server_command(self.url, self.master),
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_child_preexec,  # dies with the supervisor
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
        from . import connect_health

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
        from . import connect_health

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
            except (ConnectConfigError, OSError) as exc:
                error = f"cannot restart the server: {exc}"
                connect_health.record(self.url, self.master, pid=None, healthy=False, error=error)
                self.log(f"spark connect server: {error}; trying again in {self.backoff:.0f}s")
            return
        error, self.session = probe(self.url, self.session)
        connect_health.record(self.url, self.master, pid=self.proc.pid, healthy=not error, error=error)
