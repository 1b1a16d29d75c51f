"""Spark event logs kept per run, and what a finished run's log says: its final progress and metrics.

Every launched run writes its event log (`spark.eventLog.*`, uncompressed JSON lines) into its own directory,
`<JOBSITE_SPARK_EVENT_LOG_DIR or var/spark-events>/run-<id>/`, one file per attempt named by the Spark app id.
The run page names the file; Spark's history server reads the directory as it is. For a script (which prints
no progress events of its own) the log is also where the final numbers come from once the driver has gone:
the status REST API it served while running stops with it.

A finished run's log is deleted with the run (its job's policy `keep_days`) or, for a job that sets none, after
the `SPARK_EVENT_LOG_KEEP_DAYS` setting (14 days by default; runs.prune_event_logs, from the prune task).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

from queue_app.conf import var_dir


def base_dir() -> str:
    return os.environ.get("JOBSITE_SPARK_EVENT_LOG_DIR") or os.path.join(str(var_dir()), "spark-events")


def run_dir(run_id: int | str) -> str:
    return os.path.join(base_dir(), f"run-{run_id}")


def conf(run_id: int | str) -> dict[str, str]:
    """Spark conf that writes the run's event log into its own directory (created here)."""
    directory = run_dir(run_id)
    os.makedirs(directory, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{os.path.abspath(directory)}",
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def files(run_id: int | str) -> list[str]:
    """The run's event log files, oldest first (one per attempt; `.inprogress` while its driver lives)."""
    directory = run_dir(run_id)
    try:
        names = [os.path.join(directory, n) for n in os.listdir(directory)]
    except OSError:
        return []
    return sorted((n for n in names if os.path.isfile(n)), key=os.path.getmtime)


def log_for(run_id: int | str, app_id: str | None) -> str | None:
    """The event log file of app `app_id` of run `run_id` (finished or still in progress), if there is one."""
    for path in reversed(files(run_id)):
        name = os.path.basename(path)
        if not app_id or name in (app_id, f"{app_id}.inprogress"):
            return path
    return None


def runs_on_disk() -> dict[int, float]:
    """{run id: modification time} of every run directory under the base directory."""
    try:
        entries = list(os.scandir(base_dir()))
    except OSError:
        return {}
    found = {}
    for entry in entries:
        name = entry.name
        if name.startswith("run-") and name[4:].isdigit() and entry.is_dir(follow_symlinks=False):
            found[int(name[4:])] = entry.stat(follow_symlinks=False).st_mtime
    return found


def delete(run_ids: Iterable[int]) -> None:
    for run_id in run_ids:
        shutil.rmtree(run_dir(run_id), ignore_errors=True)


_METRICS = {
    "Executor Run Time": "executor_run_ms",
    "JVM GC Time": "gc_ms",
    "Result Size": "result_bytes",
}


def summarize(path: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """(progress, metrics, times) of the application whose event log is at `path`.

    Progress counts like the child's status-tracker poll: a stage skipped because its shuffle output existed
    counts as done. Metrics sum the successful tasks' metrics (input, output, shuffle, run time). Times are the
    driver's own clock, epoch seconds: `driver_up` (the application started), `first_task` (the first task
    launched), `last_task` (the last task finished), as far as the log got.
    """
    tally = Tally()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            tally.feed_line(line)
    return tally.progress(), tally.metrics(), dict(tally.times)


class Tally:
    """What an event log says so far, fed one line at a time: a finished log's summary (`summarize`), or a live
    one's progress as its driver writes it (statusapi.Follower reads a script's log while it runs)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.stages: dict[int, int] = {}  # stage id -> number of tasks
        self.stage_done: set[int] = set()
        self.submitted: set[int] = set()
        self.jobs: dict[int, list[int]] = {}
        self.jobs_ok: set[int] = set()
        self.jobs_failed: set[int] = set()
        self.tasks_started = self.tasks_done = self.tasks_failed = 0
        self.task_metrics = dict.fromkeys(
            (
                "input_bytes",
                "input_records",
                "output_bytes",
                "output_records",
                "shuffle_read_bytes",
                "shuffle_write_bytes",
            ),
            0,
        )
        self.task_metrics.update(dict.fromkeys(_METRICS.values(), 0))

    def feed_line(self, line: str) -> dict[str, Any] | None:
        """Take one line of the log; returns its event (None for a line that is not one)."""
        try:
            event = json.loads(line)
        except ValueError:
            return None  # the last line of a log whose driver was killed mid-write
        if isinstance(event, dict):
            self.feed(event)
            return event
        return None

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("Event")
        if kind == "SparkListenerApplicationStart" and event.get("Timestamp"):
            self.times["driver_up"] = event["Timestamp"] / 1000
        elif kind == "SparkListenerTaskStart":
            self.tasks_started += 1
            launched = (event.get("Task Info") or {}).get("Launch Time")
            if launched:
                self.times["first_task"] = min(self.times.get("first_task", launched / 1000), launched / 1000)
        elif kind == "SparkListenerJobStart":
            infos = event.get("Stage Infos") or []
            self.jobs[event["Job ID"]] = [s["Stage ID"] for s in infos]
            for s in infos:
                self.stages[s["Stage ID"]] = s.get("Number of Tasks", 0)
        elif kind == "SparkListenerJobEnd":
            ok = (event.get("Job Result") or {}).get("Result") == "JobSucceeded"
            (self.jobs_ok if ok else self.jobs_failed).add(event["Job ID"])
        elif kind == "SparkListenerStageSubmitted":
            self.submitted.add(event["Stage Info"]["Stage ID"])
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            if not info.get("Failure Reason"):
                self.stage_done.add(info["Stage ID"])
        elif kind == "SparkListenerTaskEnd":
            finished = (event.get("Task Info") or {}).get("Finish Time")
            if finished:
                self.times["last_task"] = max(self.times.get("last_task", 0.0), finished / 1000)
            if (event.get("Task End Reason") or {}).get("Reason") != "Success":
                self.tasks_failed += 1
                return
            self.tasks_done += 1
            _add_task_metrics(self.task_metrics, event.get("Task Metrics") or {})

    def running(self) -> bool:
        """A job has started and not ended, as far as the log got."""
        return len(self.jobs) > len(self.jobs_ok) + len(self.jobs_failed)

    def progress(self, *, live: bool = False) -> dict[str, Any]:
        """The progress so far; `live` counts tasks started and not ended as active (a finished log has none)."""
        skipped = {s for job in self.jobs_ok for s in self.jobs[job] if s not in self.submitted}
        total = sum(self.stages.values())
        # A completed stage's tasks are all done, even those whose ends the driver had not yet flushed.
        counted = self.tasks_done + sum(self.stages[s] for s in skipped)
        completed = sum(self.stages[s] for s in self.stage_done if s in self.stages) if live else 0
        return {
            "jobs_total": len(self.jobs),
            "jobs_done": len(self.jobs_ok),
            "jobs_failed": len(self.jobs_failed),
            "stages_total": len(self.stages),
            "stages_done": len((self.stage_done | skipped) & self.stages.keys()),
            "tasks_total": total,
            "tasks_done": min(max(counted, completed), total),
            "tasks_active": max(0, self.tasks_started - self.tasks_done - self.tasks_failed) if live else 0,
            "tasks_failed": self.tasks_failed,
        }

    def metrics(self) -> dict[str, Any]:
        return {**self.task_metrics, "tasks": self.tasks_done, "jobs": len(self.jobs)}


def _add_task_metrics(metrics: dict[str, Any], tm: dict[str, Any]) -> None:
    for key, name in _METRICS.items():
        metrics[name] += tm.get(key) or 0
    metrics["input_bytes"] += (tm.get("Input Metrics") or {}).get("Bytes Read", 0)
    metrics["input_records"] += (tm.get("Input Metrics") or {}).get("Records Read", 0)
    metrics["output_bytes"] += (tm.get("Output Metrics") or {}).get("Bytes Written", 0)
    metrics["output_records"] += (tm.get("Output Metrics") or {}).get("Records Written", 0)
    read = tm.get("Shuffle Read Metrics") or {}
    metrics["shuffle_read_bytes"] += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)
    metrics["shuffle_write_bytes"] += (tm.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)


def timeline(path: str) -> list[dict[str, Any]]:
    """The Spark jobs and stages of the application whose event log is at `path`, with their times (the driver's
    clock, epoch seconds): what a run's trace shows as child spans (engine/tracing.py). Each is {"kind": "job" or
    "stage", "id", "name", "start", "end", "ok", "tasks", "job" (a stage's job id)}; only those that ended."""
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    stages: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("Event")
            if kind == "SparkListenerJobStart" and event.get("Submission Time"):
                job_id = event["Job ID"]
                jobs[job_id] = {"kind": "job", "id": job_id, "name": f"spark job {job_id}"}
                jobs[job_id]["start"] = event["Submission Time"] / 1000
                for s in event.get("Stage Infos") or []:
                    stage_job[s["Stage ID"]] = job_id
            elif kind == "SparkListenerJobEnd" and event.get("Job ID") in jobs and event.get("Completion Time"):
                job = jobs[event["Job ID"]]
                job["end"] = event["Completion Time"] / 1000
                job["ok"] = (event.get("Job Result") or {}).get("Result") == "JobSucceeded"
            elif kind == "SparkListenerStageCompleted":
                info = event.get("Stage Info") or {}
                if info.get("Submission Time") and info.get("Completion Time"):
                    stages.append(
                        {
                            "kind": "stage",
                            "id": info["Stage ID"],
                            "name": f"spark stage {info['Stage ID']}: {info.get('Stage Name', '')}"[:200],
                            "start": info["Submission Time"] / 1000,
                            "end": info["Completion Time"] / 1000,
                            "ok": not info.get("Failure Reason"),
                            "tasks": info.get("Number of Tasks", 0),
                            "job": stage_job.get(info["Stage ID"]),
                        }
                    )
    return [job for job in jobs.values() if "end" in job] + stages
