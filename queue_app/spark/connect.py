"""Warm runs: an opt-in Spark Connect server run and supervised by jobsite, and how runs find it.

`manage.py spark_connect_server` starts the server with the installed pyspark (`spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`, pyspark's jars carry it) on loopback only, restarts
it when it dies, and writes its health to a SparkConnectServer row (connect_server.py, connect_health.py).
Setting `JOBSITE_SPARK_CONNECT` (e.g. `sc://127.0.0.1:15002`; unset: off) makes the launcher run registered
functions through that server: each run is a light Python child with its own Connect session (own temp views
and conf), its operations tagged with the run's tag so cancel interrupts only them. After a warm run the
launcher starts a spare light child that gets ready for the next one (imports, Django, its session opened and
that session's Python worker started on the server): the next run skips about 2 s of start-up. A server that
does not answer, or dies mid-run, sends the run to spark-submit in the same attempt (launcher.py,
warm_pool.py); nothing waits on it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
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


# How long a probe's query may take. PySpark 4.0's Connect client sets no deadline on a query's RPC: a query the
# server took and never answers blocks its caller for good (seen once in CI, a probe sent while a restarted server
# came up: the supervisor then never probed or recorded again, and its server stayed unhealthy).
PROBE_DEADLINE = 30.0


def probe(url: ConnectUrl, spark=None, *, deadline: float = PROBE_DEADLINE):
    """(error, session): error is '' when the server ran a query in `spark` (a session kept between probes,
    opened when None) within `deadline` seconds. A failed probe drops its session."""
    if not reachable(url):
        return f"nothing listens on {url.host}:{url.port}", None
    try:
        spark = spark if spark is not None else open_session(url)
    except Exception as exc:  # any client error means: not healthy
        return _said(exc), None
    error = probe_error(spark, deadline=deadline)
    return error, None if error else spark


def probe_error(spark, *, deadline: float = PROBE_DEADLINE) -> str:
    """'' when the server of session `spark` runs a query within `deadline` seconds, else what went wrong. The
    query runs in a thread of its own; past the deadline the session's channel is closed, which ends the query's
    RPC (and the thread), and the probe has failed."""
    said: list[str] = []

    def query() -> None:
        try:
            spark.range(1).collect()
        except Exception as exc:
            said.append(_said(exc))
        else:
            said.append("")

    thread = threading.Thread(target=query, name="spark-connect-probe", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        with contextlib.suppress(Exception):
            spark.client.close()
        return f"the server did not answer a query within {deadline:g} s"
    return said[0]


def _said(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"
