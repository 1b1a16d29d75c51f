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

Both paths share argument parsing here and child_run.run_job(): the SIGTERM-as-cancel handling and the result
files are one code. Cancel: on SIGTERM the progress thread calls `cancelJobGroup` (on its own py4j connection:
the main thread may be blocked inside a py4j call, so the handler itself never talks to the JVM), the main
thread stops with `RunCancelled`, and the process exits with protocol.EXIT_CANCELLED.
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
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from queue_app.spark import protocol  # noqa: E402
from queue_app.spark.child_run import run_job, write_failure  # noqa: E402
from queue_app.spark.protocol import PROGRESS_INTERVAL, emit  # noqa: E402
from queue_app.stop_signals import Wakeup  # noqa: E402

log = logging.getLogger("queue_app.spark.child")


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
        # Set from the SIGTERM handler (child_run.run_job's on_cancel): a flag and a Wakeup, no lock to wait for.
        self.cancel_requested = False
        self._wake = Wakeup()
        self._stopping = False
        self._cancel_sent = False
        self._final: dict[int, dict[str, Any]] = {}
        self._last: dict[str, Any] | None = None
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def request_cancel(self) -> None:
        self.cancel_requested = True
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(5)

    def run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            if self.cancel_requested and not self._cancel_sent:
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
                if self.cancel_requested:
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
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable of this run only, for a spare started before its run (warm_pool.PER_RUN)",
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
    for pair in args.env:  # the run's own variables (the report channel, the trace parent)
        key, _, value = pair.partition("=")
        os.environ[key] = value
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
