"""Progress of a driver that runs no jobsite code (an existing script), read from its status REST API.

The launcher starts the script's driver with its UI on a port it picked on loopback and a tag in its conf
(`spark.jobsite.run`). A thread here polls `http://127.0.0.1:<port>/api/v1/applications/...` about once a
second and turns what it reads into the same protocol lines the child prints (STARTED, PROGRESS), put on the
launcher's line queue: one path from there on for every kind of run. An application found on that port whose
conf lacks the tag (the port was taken meanwhile) is not followed.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from queue_app.spark import protocol

TAG = "spark.jobsite.run"
HTTP_TIMEOUT = 2.0


def free_port() -> int:
    """A TCP port free on loopback now (the driver binds it a moment later; the tag check covers a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StatusPoller(threading.Thread):
    def __init__(self, port: int, tag: str, pid: int, put: Callable[[str], Any], *, interval: float = 1.0) -> None:
        super().__init__(name="jobsite-status-api", daemon=True)
        self.base = f"http://127.0.0.1:{port}/api/v1/applications"
        self.ui_url = f"http://127.0.0.1:{port}"
        self.tag, self.pid, self.put, self.interval = tag, pid, put, interval
        self.app_id: str | None = None
        self.stopping = threading.Event()
        self._last: dict[str, Any] | None = None

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(HTTP_TIMEOUT + 1)

    def get(self, path: str = "") -> Any:
        with urllib.request.urlopen(self.base + path, timeout=HTTP_TIMEOUT) as response:  # noqa: S310 (loopback)
            return json.load(response)

    def run(self) -> None:
        while not self.stopping.wait(self.interval if self.app_id else min(self.interval, 0.25)):
            try:
                if self.app_id is None and not self._find_app():
                    continue
                self._report()
            except (OSError, ValueError, urllib.error.URLError):
                continue  # not up yet, or going down: the event log has the final numbers

    def _find_app(self) -> bool:
        apps = self.get()
        for app in apps if isinstance(apps, list) else []:
            env = self.get(f"/{app['id']}/environment")
            props = dict(env.get("sparkProperties") or [])
            if props.get(TAG) != self.tag:
                self.stopping.set()  # someone else's driver on this port: follow nothing
                return False
            self.app_id = app["id"]
            self.put(
                protocol.encode(
                    protocol.STARTED,
                    {
                        "app_id": self.app_id,
                        "ui_url": self.ui_url,
                        "pid": self.pid,
                        "master": props.get("spark.master"),
                        "spark_version": next(iter(app.get("attempts") or []), {}).get("appSparkVersion"),
                    },
                )
            )
            return True
        return False

    def _report(self) -> None:
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
        if progress != self._last:
            self._last = progress
            self.put(protocol.encode(protocol.PROGRESS, progress))
