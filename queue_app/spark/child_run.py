"""What both kinds of a run's child share (child.py with its own JVM, connect_child.py through jobsite's Spark
Connect server): running the job's function in the main thread with SIGTERM as cancel, and the result file.

The result goes to the `--output-file`, written atomically (the launcher sees all of it or nothing). Cancel: the
first SIGTERM calls the child's `on_cancel` (which must not talk to Spark: the main thread may be inside a call),
the main thread stops with RunCancelled, and the child writes a cancelled result and leaves with
protocol.EXIT_CANCELLED.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import traceback
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from queue_app.spark import protocol

if TYPE_CHECKING:
    from queue_app.spark.registry import SparkJob

log = logging.getLogger("queue_app.spark.child")


class RunCancelled(BaseException):
    """Raised in the main thread by the SIGTERM handler; a BaseException so no `except Exception` eats it."""


def write_output(path: str, result: dict[str, Any]) -> None:
    """Write the result atomically: the launcher sees all of it or nothing."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".result-")
    with os.fdopen(fd, "w") as out:
        json.dump(result, out, default=str)
    os.replace(tmp, path)


def write_failure(path: str, error: str, base: dict[str, Any] | None = None, exc: BaseException | None = None) -> None:
    """The failed result: what went wrong, and the traceback of `exc` when there is one."""
    result = {**(base or {}), "status": "failed", "error": error[:4000]}
    if exc is not None:
        result["traceback"] = "".join(traceback.format_exception(exc))[-20000:]
    write_output(path, result)


def run_job(
    job: SparkJob,
    spark,
    params: dict[str, Any],
    output_file: str,
    base: dict[str, Any],
    *,
    on_cancel: Callable[[], Any],
    final_progress: Callable[[], dict[str, Any]],
    on_cancelled: Callable[[], Any] = lambda: None,
    divert: Callable[[BaseException], int | None] = lambda exc: None,
) -> int:
    """Run the job in this (main) thread and write its result; the exit code.

    The first SIGTERM calls `on_cancel` (which must not talk to Spark: the main thread may be inside a call) and
    stops the job with RunCancelled; the child then writes a cancelled result and leaves at once with
    EXIT_CANCELLED (`on_cancelled` first). `divert(exc)` may name another exit code for a failure that is not
    the job's (it leaves at once too, writing nothing).
    """
    # Plain flags, not threading.Events: the handler runs in this thread between two bytecodes, and an Event's set()
    # or clear() there could wait for the lock this thread holds inside another call (queue_app/stop_signals.py).
    flags = types.SimpleNamespace(cancel=False, in_job=False)

    def on_sigterm(signum, frame):
        if not flags.cancel:
            flags.cancel = True
            on_cancel()
        if flags.in_job:
            flags.in_job = False
            raise RunCancelled()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        flags.in_job = True
        if flags.cancel:  # SIGTERM came while the session was starting
            raise RunCancelled()
        try:
            result = job.func(spark, params)
        finally:
            flags.in_job = False
    except BaseException as exc:
        if flags.cancel:
            on_cancelled()
            write_output(output_file, {**base, "status": "cancelled", "error": "cancelled (SIGTERM)"})
            leave(protocol.EXIT_CANCELLED)  # connections may be mid-call and Spark going down: no teardown
        code = divert(exc)
        if code is not None:
            leave(code)
        log.error("Spark job %s failed", job.name, exc_info=True)
        write_failure(output_file, "".join(traceback.format_exception_only(type(exc), exc)).strip(), base, exc)
        return protocol.EXIT_FAILED
    from queue_app.spark import registry

    if isinstance(result, registry.JobResult):
        metrics, outputs = dict(result.metrics), result.outputs
    else:
        metrics, outputs = dict(result or {}), None
    progress = final_progress()
    write_output(
        output_file, {**base, "status": "succeeded", "metrics": metrics, "outputs": outputs, "progress": progress}
    )
    return 0


def leave(code: int) -> None:
    """Exit now with `code`, without teardown (flushing what was printed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
