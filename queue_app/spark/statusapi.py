"""Progress of a driver that runs no jobsite code (an existing script): its event log first, its status REST API
once a job has run a while.

The launcher starts the script's driver with its event log in the run's own directory (eventlog.py), its UI on a
port it picked on loopback, and a tag in its conf (`spark.jobsite.run`). A thread here reads the log as the
driver writes it: the application's start (its id, master and Spark version, in the attempt whose conf carries
the tag) and each job's and stage's start and end (the driver flushes its log at those). It turns them into the
same protocol lines the child prints (STARTED, PROGRESS), put on the launcher's line queue: one path from there
on for every kind of run. Each PROGRESS says where it was read (`source`: "event log" or "status API").

The status API (`http://127.0.0.1:<port>/api/v1/applications/...`) counts tasks as they run, but the driver's
first answer costs it about 2 s (the REST layer starts on that first request; later calls take ~0.06 s), which
a bare spark-submit never pays. So it is asked only once a job has been running `API_AFTER` seconds: a short
script is followed by its log alone, a long one gets its tasks counted live.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from queue_app.conf import env_number
from queue_app.spark import eventlog, protocol

TAG = "spark.jobsite.run"
HTTP_TIMEOUT = 2.0
# Seconds a job runs before the driver's status API is asked for its tasks (its first answer ~2 s, then small).
API_AFTER = env_number("JOBSITE_SPARK_STATUS_API_AFTER", 30.0, unit=" of seconds")


def free_port() -> int:
    """A TCP port free on loopback now (the driver binds it a moment later; the tag check covers a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StatusPoller(threading.Thread):
    def __init__(
        self,
        port: int,
        tag: str,
        pid: int,
        put: Callable[[str], Any],
        *,
        log_dir: str,
        interval: float = 1.0,
        api_after: float | None = None,
    ) -> None:
        super().__init__(name="jobsite-status-api", daemon=True)
        self.base = f"http://127.0.0.1:{port}/api/v1/applications"
        self.ui_url = f"http://127.0.0.1:{port}"
        self.tag, self.pid, self.put, self.interval = tag, pid, put, interval
        self.log_dir, self.api_after = log_dir, API_AFTER if api_after is None else api_after
        self.app_id: str | None = None
        self.stopping = threading.Event()
        self._last: dict[str, Any] | None = None
        self.log = _LogFollower(log_dir, tag)
        self._running_since: float | None = None
        self.api_on = False

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(HTTP_TIMEOUT + 1)

    def get(self, path: str = "") -> Any:
        with urllib.request.urlopen(self.base + path, timeout=HTTP_TIMEOUT) as response:  # noqa: S310 (loopback)
            return json.load(response)

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval if self.app_id else min(self.interval, 0.25)):
                try:
                    self._round()
                except (OSError, ValueError, urllib.error.URLError):
                    continue  # not up yet, or going down: the event log has the final numbers
        finally:
            self.log.close()

    def _round(self) -> None:
        self.log.read()
        if self.app_id is None:
            if self.log.started is None:
                return
            self.app_id = self.log.started["app_id"]
            self.put(protocol.encode(protocol.STARTED, {**self.log.started, "ui_url": self.ui_url, "pid": self.pid}))
        if self._ask_api():
            try:
                self._report({**self._from_api(), "source": "status API"})
                return
            except (OSError, ValueError, urllib.error.URLError):
                pass  # the log's figures meanwhile
        self._report({**self.log.tally.progress(live=True), "active_stages": [], "source": "event log"})

    def _ask_api(self) -> bool:
        """Once a job has been running `api_after` seconds (by this thread's clock), and from then on."""
        if not self.api_on:
            if not self.log.tally.running():
                self._running_since = None
            elif self._running_since is None:
                self._running_since = time.monotonic()
            elif time.monotonic() - self._running_since >= self.api_after:
                self.api_on = True
        return self.api_on

    def _from_api(self) -> dict[str, Any]:
        jobs = self.get(f"/{self.app_id}/jobs")
        progress = protocol.zero_progress()
        for job in jobs:
            progress["jobs_total"] += 1
            progress["jobs_done"] += job["status"] == "SUCCEEDED"
            progress["jobs_failed"] += job["status"] == "FAILED"
            progress["stages_total"] += len(job.get("stageIds") or ())
            progress["stages_done"] += job.get("numCompletedStages", 0) + job.get("numSkippedStages", 0)
            progress["tasks_total"] += job.get("numTasks", 0)
            progress["tasks_done"] += job.get("numCompletedTasks", 0) + job.get("numSkippedTasks", 0)
            progress["tasks_active"] += job.get("numActiveTasks", 0)
            progress["tasks_failed"] += job.get("numFailedTasks", 0)
        active = self.get(f"/{self.app_id}/stages?status=active") if progress["tasks_active"] else []
        progress["active_stages"] = [
            {
                "id": s["stageId"],
                "name": s.get("name", ""),
                "tasks_done": s.get("numCompleteTasks", 0),
                "tasks_total": s.get("numTasks", 0),
            }
            for s in active
        ]
        return progress

    def _report(self, progress: dict[str, Any]) -> None:
        if progress != self._last:
            self._last = progress
            self.put(protocol.encode(protocol.PROGRESS, progress))


class _LogFollower:
    """The event log of this attempt's driver, read as it grows: the file in `log_dir` whose environment carries
    `tag` (an earlier attempt's log in the same directory carries another), fed line by line to a Tally."""

    def __init__(self, log_dir: str, tag: str) -> None:
        self.log_dir, self.tag = log_dir, tag
        self.tally = eventlog.Tally()
        self.started: dict[str, Any] | None = None  # STARTED's payload once the application's start is read
        self._file = None
        self._partial = ""
        self._others: set[str] = set()  # files of other attempts
        self._props: dict[str, Any] = {}
        self._version: str | None = None

    def read(self) -> None:
        if self._file is None and not self._find():
            return
        self._feed(self._file.read())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def _find(self) -> bool:
        try:
            names = sorted(os.listdir(self.log_dir))
        except OSError:
            return False
        for name in names:
            path = os.path.join(self.log_dir, name)
            if name in self._others or not os.path.isfile(path):
                continue
            f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 (kept open while followed)
            head = f.read()
            tag = _environment_tag(head)
            if tag is None:  # its environment not written yet
                f.close()
                continue
            if tag != self.tag:
                self._others.add(name)
                f.close()
                continue
            self._file = f
            self._feed(head)
            return True
        return False

    def _feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the rest
        for line in lines:
            event = self.tally.feed_line(line)
            if event is None:
                continue
            kind = event.get("Event")
            if kind == "SparkListenerLogStart":
                self._version = event.get("Spark Version")
            elif kind == "SparkListenerEnvironmentUpdate":
                self._props = event.get("Spark Properties") or {}
            elif kind == "SparkListenerApplicationStart" and self.started is None and event.get("App ID"):
                self.started = {
                    "app_id": event["App ID"],
                    "master": self._props.get("spark.master"),
                    "spark_version": self._version,
                }


def _environment_tag(text: str) -> str | None:
    """The tag in the environment event among complete lines of `text` ("" when it has none), None before it."""
    for line in text.split("\n")[:-1]:
        if '"SparkListenerEnvironmentUpdate"' not in line:
            continue
        try:
            props = json.loads(line).get("Spark Properties") or {}
        except ValueError:
            return None
        return str(props.get(TAG, "")) if isinstance(props, dict) else ""
    return None
