"""The program spark-submit runs for one Spark run, in its own JVM and process group.

    spark-submit ... queue_app/spark/child.py --job NAME --params-json '{...}' --run-id ID --output-file PATH

It sets Django up, validates the parameters again, gets the SparkSession spark-submit configured, and runs the
job in the job group `jobsite-run-<id>`. While the job runs, a thread polls `statusTracker()` for that group
about once a second and prints progress events (protocol.py) on stdout; everything else the run prints is a
log line. The result (status, metrics, outputs, error) goes to the output file, written atomically.

With `--connect sc://...` the launcher starts this file with plain Python (no spark-submit, no JVM) and the run
goes through a session of jobsite's Spark Connect server instead (connect_child.py). With `--standby --connect
URL` it is the launcher's spare light child: it sets Django up, imports the Connect client and prepares a session
(connect_child.Prepared), then reads the next warm run's arguments as one JSON list on stdin and runs it.

Both paths share run_job(): argument parsing, the SIGTERM-as-cancel handling and the result files are one code.
Cancel: on SIGTERM the progress thread calls `cancelJobGroup` (on its own py4j connection: the main thread may
be blocked inside a py4j call, so the handler itself never talks to the JVM), the main thread stops with
`RunCancelled`, and the process exits with protocol.EXIT_CANCELLED.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__":
    # Run as a script, this file's directory is sys.path[0]: its sibling modules (session, db, java ...) would
    # shadow top-level names. Import the package from the project root instead.
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    _ROOT = os.path.dirname(os.path.dirname(_HERE))
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from queue_app.spark import protocol  # noqa: E402

if TYPE_CHECKING:
    from queue_app.spark.registry import SparkJob

log = logging.getLogger("queue_app.spark.child")
PROGRESS_INTERVAL = float(os.environ.get("JOBSITE_SPARK_PROGRESS_INTERVAL", "1.0"))
_stdout_lock = threading.Lock()


class RunCancelled(BaseException):
    """Raised in the main thread by the SIGTERM handler; a BaseException so no `except Exception` eats it."""


def emit(kind: str, payload: dict[str, Any]) -> None:
    line = protocol.encode(kind, payload)
    with _stdout_lock:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):  # the JVM relaying our stdout is gone; nobody is listening
            pass


class ProgressMonitor(threading.Thread):
    """Polls the status tracker for one job group and emits a progress event whenever the counts change.

    A finished job's counts never change again, so they are kept and not asked for again: polling costs
    grow with the running jobs, not with the run's whole history.
    """

    def __init__(self, sc, group: str, *, interval: float = PROGRESS_INTERVAL, emit=emit) -> None:
        super().__init__(name="jobsite-progress", daemon=True)
        self.sc = sc
        self.group = group
        self.interval = interval
        self.emit = emit
        self.cancel_requested = threading.Event()
        self._wake = threading.Event()
        self._stopping = False
        self._cancel_sent = False
        self._final: dict[int, dict[str, Any]] = {}
        self._last: dict[str, Any] | None = None
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def request_cancel(self) -> None:
        self.cancel_requested.set()
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(5)

    def run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self.cancel_requested.is_set() and not self._cancel_sent:
                self._cancel_sent = True
                try:
                    self.sc.cancelJobGroup(self.group)
                except Exception:  # the JVM got the SIGTERM too and may be gone already
                    log.debug("cancelJobGroup failed", exc_info=True)
            if self._stopping:
                return
            try:
                self.report()
            except Exception:
                if self.cancel_requested.is_set():
                    return
                log.warning("progress poll failed", exc_info=True)

    def report(self, *, force: bool = False) -> dict[str, Any]:
        """Emit the current progress if it changed (or `force`); returns it."""
        with self._lock:
            snapshot = self.snapshot()
            if force or snapshot != self._last:
                self._last = snapshot
                self.emit(protocol.PROGRESS, {**snapshot, "elapsed": round(time.monotonic() - self._t0, 3)})
            return snapshot

    def snapshot(self) -> dict[str, Any]:
        tracker = self.sc.statusTracker()
        active = set(tracker.getActiveStageIds())
        total = protocol.zero_progress()
        active_stages: list[dict[str, Any]] = []
        for job_id in sorted(tracker.getJobIdsForGroup(self.group)):
            counts = self._final.get(job_id)
            if counts is None:
                info = tracker.getJobInfo(job_id)
                if info is None:
                    continue
                counts = self._job_counts(tracker, info, active, active_stages)
                if info.status in ("SUCCEEDED", "FAILED"):
                    self._final[job_id] = counts
            for key, value in counts.items():
                total[key] += value
        total["active_stages"] = active_stages
        return total

    @staticmethod
    def _job_counts(tracker, info, active: set[int], active_stages: list[dict[str, Any]]) -> dict[str, int]:
        counts = {
            "jobs_total": 1,
            "jobs_done": int(info.status == "SUCCEEDED"),
            "jobs_failed": int(info.status == "FAILED"),
            "stages_total": 0,
            "stages_done": 0,
            "tasks_total": 0,
            "tasks_done": 0,
            "tasks_active": 0,
            "tasks_failed": 0,
        }
        for stage_id in list(info.stageIds):
            stage = tracker.getStageInfo(stage_id)
            if stage is None:
                continue
            done = min(stage.numCompletedTasks, stage.numTasks)
            if info.status == "SUCCEEDED" and done == 0 and stage.numTasks:
                # Skipped (its shuffle output already existed): counted as done, not dropped, so the run's
                # totals never shrink when its job ends.
                done = stage.numTasks
            counts["stages_total"] += 1
            counts["stages_done"] += int(done >= stage.numTasks and stage_id not in active)
            counts["tasks_total"] += stage.numTasks
            counts["tasks_done"] += done
            counts["tasks_active"] += stage.numActiveTasks
            counts["tasks_failed"] += stage.numFailedTasks
            if stage_id in active:
                active_stages.append(
                    {"id": stage_id, "name": stage.name, "tasks_done": done, "tasks_total": stage.numTasks}
                )
        return counts


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
    cancel = threading.Event()
    in_job = threading.Event()

    def on_sigterm(signum, frame):
        if not cancel.is_set():
            cancel.set()
            on_cancel()
        if in_job.is_set():
            in_job.clear()
            raise RunCancelled()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        in_job.set()
        if cancel.is_set():  # SIGTERM came while the session was starting
            raise RunCancelled()
        try:
            result = job.func(spark, params)
        finally:
            in_job.clear()
    except BaseException as exc:
        if cancel.is_set():
            on_cancelled()
            write_output(output_file, {**base, "status": "cancelled", "error": "cancelled (SIGTERM)"})
            _leave(protocol.EXIT_CANCELLED)  # connections may be mid-call and Spark going down: no teardown
        code = divert(exc)
        if code is not None:
            _leave(code)
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


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run one jobsite Spark job (started by the launcher).")
    parser.add_argument("--job")
    parser.add_argument("--params-json", default="{}")
    parser.add_argument("--run-id")
    parser.add_argument("--output-file")
    parser.add_argument("--connect", help="run through this Spark Connect server (sc://...) instead of a local JVM")
    parser.add_argument("--tag", default="", help="the operation tag of this attempt (with --connect)")
    parser.add_argument(
        "--standby",
        action="store_true",
        help="with --connect: get ready (imports, session, the server's Python worker), then read the run's "
        "arguments as one JSON list on stdin",
    )
    args = parser.parse_args(argv)
    missing = [] if args.standby else [f"--{n}" for n in ("job", "run_id", "output_file") if not getattr(args, n)]
    if missing or (args.standby and not args.connect):
        parser.error(f"missing {', '.join(missing)}" if missing else "--standby needs --connect")
    return args


def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()
    args = _parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
    import django

    django.setup()
    setup = {"django": round(time.monotonic() - began, 3)}
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from queue_app.spark import registry, session

    prepared = None
    if args.standby:
        from queue_app.spark import connect_child

        prepared = connect_child.Prepared(args.connect)
        waiting = time.monotonic()
        line = sys.stdin.readline()
        if not line:  # the launcher let this spare go unused
            prepared.close()
            return 0
        args = _parse(json.loads(line))
        setup["standby"] = round(time.monotonic() - waiting, 3)
    os.environ[protocol.RUN_ID_ENV] = str(args.run_id)  # the run's own, for workflows.spark_upstream()
    try:
        job = registry.get_job(args.job)
        params = job.validate(json.loads(args.params_json))
    except (registry.SparkJobError, ValueError) as exc:
        write_failure(args.output_file, str(exc))
        return protocol.EXIT_BAD_PARAMS

    if args.connect:
        from queue_app.spark import connect_child

        return connect_child.run(args, job, params, setup, prepared)

    from pyspark.sql import SparkSession

    django_ready = time.monotonic()
    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    group = session.job_group(args.run_id)
    sc.setJobGroup(group, f"{job.name} (run {args.run_id})", interruptOnCancel=True)
    base = {"app_id": sc.applicationId}
    emit(
        protocol.STARTED,
        {
            **base,
            "master": sc.master,
            "spark_version": sc.version,
            "pid": os.getpid(),
            "ui_url": sc.uiWebUrl,  # None when the UI is off (JOBSITE_SPARK_UI=false, the default)
            "job": job.name,
            # Where the child's start-up went (the JVM that launched this process started before it).
            "setup_seconds": {**setup, "spark_session": round(time.monotonic() - django_ready, 3)},
        },
    )
    monitor = ProgressMonitor(sc, group)
    monitor.start()

    def final_progress() -> dict[str, Any]:
        monitor.stop()
        return monitor.report(force=True)

    code = run_job(
        job, spark, params, args.output_file, base, on_cancel=monitor.request_cancel, final_progress=final_progress
    )
    monitor.stop()
    try:
        spark.stop()
    except Exception:  # the JVM may be gone (it failed the job); the result is written already
        log.debug("spark.stop() failed", exc_info=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
