"""One run through jobsite's Spark Connect server, inside child.py started with `--connect URL --tag TAG`.

The child is plain Python (no JVM of its own): it opens a new Connect session for the run (its own temp views
and conf), tags its operations with the attempt's tag, and reports progress from the Connect client's progress
handler with the same events (protocol.py) and the same shape as a spark-submit run's. A spare child (`--standby`)
opened its session before the run came and started that session's Python worker on the server (the server keys
Python workers by session, so a new session's first UDF would wait about 1 s for its own); a prepared session
the server no longer knows (it restarted meanwhile) is replaced by a fresh one, not counted as a lost server.

Cancel: on SIGTERM a thread calls `interruptTag(TAG)` on this session (only this run's operations stop, other
runs' sessions go on), the main thread stops with RunCancelled, and the child exits EXIT_CANCELLED.
A server that cannot be reached, or is lost mid-run (gone, restarted: the session is unknown), or a job that
needs the classic API (`spark.sparkContext`, RDDs), ends the child with EXIT_CONNECT_LOST and no result: the
launcher then runs the attempt with spark-submit.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any

from queue_app.spark import connect, protocol, registry, session
from queue_app.spark.child_run import run_job
from queue_app.spark.protocol import PROGRESS_INTERVAL, emit

log = logging.getLogger("queue_app.spark.connect_child")
LOST_MARKERS = ("SESSION_NOT_FOUND", "SESSION_CHANGED", "SESSION_CLOSED", "UNAVAILABLE", "Connection refused")


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` says the server is gone or no longer knows the session (not that the job failed)."""
    import grpc
    from pyspark.errors import RetriesExceeded

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RetriesExceeded):
            return True
        if isinstance(exc, grpc.RpcError) and getattr(exc, "code", None):
            with contextlib.suppress(Exception):
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    return True
        if any(marker in str(exc) for marker in LOST_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def not_on_connect(exc: BaseException) -> bool:
    """Whether the job used what a Connect session does not have (its SparkContext, RDDs): it runs classic."""
    from pyspark.errors import PySparkAttributeError, PySparkNotImplementedError

    if isinstance(exc, PySparkNotImplementedError):
        return True
    return isinstance(exc, PySparkAttributeError) and "JVM_ATTRIBUTE_NOT_SUPPORTED" in str(exc)


class ConnectProgress:
    """Progress of one session's operations from the client's progress handler, in child.py's event shape:
    each operation is a job, its stages and tasks counted; an ended operation's stages count as done."""

    def __init__(self, emit=emit, interval: float = min(PROGRESS_INTERVAL, 0.25)) -> None:
        self.emit = emit
        self.interval = interval
        self.ops: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.last: dict[str, Any] | None = None
        self.sent_at = 0.0
        self.t0 = time.monotonic()

    def __call__(self, stages=None, inflight_tasks=0, operation_id=None, done=False, **_: Any) -> None:
        with self.lock:
            op = self.ops.setdefault(operation_id or "?", {"stages": {}, "done": False, "inflight": 0})
            for stage in stages or ():
                op["stages"][stage.stage_id] = (int(stage.num_tasks), int(stage.num_completed_tasks), bool(stage.done))
            op["done"] = op["done"] or bool(done)
            op["inflight"] = 0 if done else int(inflight_tasks or 0)
        self.report(force=bool(done))

    def snapshot(self) -> dict[str, Any]:
        total = protocol.zero_progress()
        active: list[dict[str, Any]] = []
        with self.lock:
            for op in self.ops.values():
                if not op["stages"]:
                    continue
                total["jobs_total"] += 1
                total["jobs_done"] += int(op["done"])
                total["tasks_active"] += op["inflight"]
                for stage_id, (tasks, completed, stage_done) in op["stages"].items():
                    finished = stage_done or op["done"]
                    done_tasks = tasks if finished else min(completed, tasks)  # a skipped stage counts as done
                    total["stages_total"] += 1
                    total["stages_done"] += int(finished)
                    total["tasks_total"] += tasks
                    total["tasks_done"] += done_tasks
                    if not finished:
                        active.append({"id": stage_id, "name": "", "tasks_done": done_tasks, "tasks_total": tasks})
        total["active_stages"] = active
        total["path"] = "connect"
        return total

    def report(self, *, force: bool = False) -> dict[str, Any]:
        snapshot = self.snapshot()
        now = time.monotonic()
        if force or (snapshot != self.last and now - self.sent_at >= self.interval):
            self.last, self.sent_at = snapshot, now
            self.emit(protocol.PROGRESS, {**snapshot, "elapsed": round(now - self.t0, 3)})
        return snapshot


RUN_CONF = {"spark.sql.session.timeZone": "UTC"}


def _open_session(url: str):
    spark = connect.open_session(url)  # a new session: its own temp views and conf
    for key, value in RUN_CONF.items():
        with contextlib.suppress(Exception):  # static or server-wide conf cannot be set per session
            spark.conf.set(key, value)
    return spark


def start_python_worker(spark) -> None:
    """Run a trivial Python UDF once in `spark`: the server starts this session's Python worker daemon (each
    session has its own, keyed by its artifact id), so the run's first UDF finds it started (~1 s saved)."""
    from pyspark.sql import functions as F

    spark.range(1).select(F.udf(lambda x: x, "long")("id")).collect()


class Prepared:
    """A spare child's session, opened ahead of its run in a thread, with its Python worker started on the
    server. The run takes it if it is ready and the server still knows it, else opens a fresh session."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.spark = None
        self.thread = threading.Thread(target=self._open, name="jobsite-prepare", daemon=True)
        self.thread.start()

    def _open(self) -> None:
        try:
            spark = _open_session(self.url)
            start_python_worker(spark)
            self.spark = spark
        except Exception:  # the server is down or busy: the run opens its own session and says why
            log.debug("preparing a session failed", exc_info=True)

    def take(self, wait: float = 5.0):
        """The prepared session, None if it is not ready within `wait` seconds or could not be opened."""
        self.thread.join(wait)
        spark, self.spark = (None, None) if self.thread.is_alive() else (self.spark, None)
        return spark

    def close(self) -> None:
        self.thread.join(5)
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()


def run(
    args: argparse.Namespace,
    job: registry.SparkJob,
    params: dict[str, Any],
    setup: dict[str, float],
    prepared: Prepared | None = None,
) -> int:
    began = time.monotonic()
    tag = args.tag or session.job_group(args.run_id)
    spark = prepared.take() if prepared is not None and prepared.url == args.connect else None
    try:
        try:
            version = spark.version if spark is not None else ""
        except Exception:  # a server restarted since no longer knows the prepared session: a fresh one
            spark = None
        if spark is None:
            spark = _open_session(args.connect)
            version = spark.version
    except Exception as exc:
        print(f"jobsite: Spark Connect server {args.connect} unavailable: {exc}", file=sys.stderr)
        return protocol.EXIT_CONNECT_LOST
    spark.addTag(tag)
    progress = ConnectProgress()
    spark.registerProgressHandler(progress)
    base = {"app_id": f"connect-{spark.client._session_id}", "path": "connect"}
    emit(
        protocol.STARTED,
        {
            **base,
            "master": args.connect,
            "spark_version": version,
            "pid": os.getpid(),
            "ui_url": None,
            "job": job.name,
            "setup_seconds": {**setup, "spark_session": round(time.monotonic() - began, 3)},
        },
    )
    interrupter: list[threading.Thread] = []

    def interrupt() -> None:
        try:
            spark.interruptTag(tag)
        except Exception:
            log.debug("interruptTag failed", exc_info=True)

    def on_cancel() -> None:  # from the signal handler: the interrupt call goes on its own thread
        thread = threading.Thread(target=interrupt, name="jobsite-interrupt", daemon=True)
        interrupter.append(thread)
        thread.start()

    def divert(exc: BaseException) -> int | None:
        lost, unsupported = connection_lost(exc), not_on_connect(exc)
        if not (lost or unsupported):
            return None
        why = "lost mid-run" if lost else "cannot run this job (it needs the classic API)"
        print(f"jobsite: Spark Connect server {args.connect} {why}: {str(exc)[:500]}", file=sys.stderr)
        return protocol.EXIT_CONNECT_LOST

    code = run_job(
        job,
        spark,
        params,
        args.output_file,
        base,
        on_cancel=on_cancel,
        final_progress=lambda: progress.report(force=True),
        on_cancelled=lambda: [thread.join(5) for thread in interrupter],
        divert=divert,
    )
    with contextlib.suppress(Exception):
        spark.stop()  # releases this session on the server
    return code
