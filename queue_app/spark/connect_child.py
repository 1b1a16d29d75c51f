"""One run through jobsite's Spark Connect server, inside child.py started with `--connect URL --tag TAG`.

The child is plain Python (no JVM of its own): it opens a new Connect session for the run (its own temp views
and conf), tags its operations with the attempt's tag, and reports progress from the Connect client's progress
handler with the same events (protocol.py) and the same shape as a spark-submit run's.

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
import signal
import sys
import threading
import time
import traceback
from typing import Any

from queue_app.spark import connect, protocol, registry, session
from queue_app.spark.child import PROGRESS_INTERVAL, RunCancelled, emit, write_output

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


def _open_session(url: str, conf: dict[str, str]):
    spark = connect.open_session(url)  # a new session: its own temp views and conf
    for key, value in conf.items():
        with contextlib.suppress(Exception):  # static or server-wide conf cannot be set per session
            spark.conf.set(key, value)
    return spark


def run(args: argparse.Namespace, job: registry.SparkJob, params: dict[str, Any], setup: dict[str, float]) -> int:
    began = time.monotonic()
    tag = args.tag or session.job_group(args.run_id)
    conf = {"spark.sql.session.timeZone": "UTC"}
    try:
        spark = _open_session(args.connect, conf)
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
    cancel = threading.Event()
    in_job = threading.Event()
    interrupter: list[threading.Thread] = []

    def interrupt() -> None:
        try:
            spark.interruptTag(tag)
        except Exception:
            log.debug("interruptTag failed", exc_info=True)

    def on_sigterm(signum, frame):
        if not cancel.is_set():
            cancel.set()
            thread = threading.Thread(target=interrupt, name="jobsite-interrupt", daemon=True)
            interrupter.append(thread)
            thread.start()
        if in_job.is_set():
            in_job.clear()
            raise RunCancelled()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        in_job.set()
        try:
            result = job.func(spark, params)
        finally:
            in_job.clear()
    except BaseException as exc:
        if cancel.is_set():
            for thread in interrupter:
                thread.join(5)
            write_output(args.output_file, {**base, "status": "cancelled", "error": "cancelled (SIGTERM)"})
            sys.stdout.flush()
            os._exit(protocol.EXIT_CANCELLED)
        lost, unsupported = connection_lost(exc), not_on_connect(exc)
        if lost or unsupported:
            why = "lost mid-run" if lost else "cannot run this job (it needs the classic API)"
            print(f"jobsite: Spark Connect server {args.connect} {why}: {str(exc)[:500]}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(protocol.EXIT_CONNECT_LOST)
        log.error("Spark job %s failed", job.name, exc_info=True)
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        write_output(
            args.output_file,
            {**base, "status": "failed", "error": error[:4000], "traceback": traceback.format_exc()[-20000:]},
        )
        code = protocol.EXIT_FAILED
    else:
        final = progress.report(force=True)
        if isinstance(result, registry.JobResult):
            metrics, outputs = dict(result.metrics), result.outputs
        else:
            metrics, outputs = dict(result or {}), None
        write_output(
            args.output_file,
            {**base, "status": "succeeded", "metrics": metrics, "outputs": outputs, "progress": final},
        )
        code = 0
    with contextlib.suppress(Exception):
        spark.stop()  # releases this session on the server
    return code
