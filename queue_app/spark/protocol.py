"""The line protocol between a Spark run's child process (child.py) and its launcher (launcher.py).

The child writes one event per line on stdout as `JOBSITE-<KIND> <json>`; every other line the run prints
(Python logging, Spark's log4j on stderr) is a log line. Each event line goes out in a single write(), so lines
from several threads never interleave. The final result does not travel on stdout: the child writes it to the
`--output-file`, where a large payload cannot be cut by a dying pipe.

Both kinds of child (child.py with its own JVM, connect_child.py through the Connect server) write their events
with `emit()` and report progress about every PROGRESS_INTERVAL seconds.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from queue_app.conf import env_number

PREFIX = "JOBSITE-"
STARTED = "STARTED"  # {"app_id", "master", "pid", "spark_version", "setup_seconds"}: the session is up
PROGRESS = "PROGRESS"  # {"jobs_done", "jobs_total", "stages_done", ..., "tasks_done", "tasks_total", ...}
KINDS = (STARTED, PROGRESS)

# Exit codes of child.py; spark-submit passes a Python app's non-zero exit code through as its own.
# The run the child serves, set by the child itself from its --run-id (so that a waiting light child, started
# before its run was known, serves any run): workflows.spark_upstream() reads it.
RUN_ID_ENV = "JOBSITE_SPARK_RUN_ID"

EXIT_FAILED = 1
EXIT_BAD_PARAMS = 64  # sysexits EX_USAGE
EXIT_CANCELLED = 75  # sysexits EX_TEMPFAIL: SIGTERM received, job group cancelled
EXIT_CONNECT_LOST = 69  # sysexits EX_UNAVAILABLE: the Spark Connect server did not answer or went away


# Seconds between a child's looks at its progress (JOBSITE_SPARK_PROGRESS_INTERVAL).
PROGRESS_INTERVAL = env_number("JOBSITE_SPARK_PROGRESS_INTERVAL", 1.0, zero_allowed=False, unit=" of seconds")

COUNTED = ("jobs", "stages", "tasks")
# Every count a PROGRESS event carries, whichever side measures it (statusTracker in child.py, the driver's REST
# API in statusapi.py).
PROGRESS_COUNTS = (
    "jobs_total",
    "jobs_done",
    "jobs_failed",
    "stages_total",
    "stages_done",
    "tasks_total",
    "tasks_done",
    "tasks_active",
    "tasks_failed",
)


def zero_progress() -> dict[str, int]:
    return dict.fromkeys(PROGRESS_COUNTS, 0)


def monotonic(previous: dict[str, Any] | None, current: dict[str, Any] | None) -> dict[str, Any]:
    """`current` progress, never behind `previous`: a done count never falls and a total never shrinks (a
    stage Spark skips leaves the job's stage list once the job ends; a retried stage recounts its tasks)."""
    if not previous:
        return dict(current or {})
    merged = dict(current or {})  # the other keys (active stages, elapsed) are the current ones
    for kind in COUNTED:
        total = max(int(previous.get(f"{kind}_total") or 0), int(merged.get(f"{kind}_total") or 0))
        done = max(int(previous.get(f"{kind}_done") or 0), int(merged.get(f"{kind}_done") or 0))
        merged[f"{kind}_total"], merged[f"{kind}_done"] = total, min(done, total) if total else done
    return merged


def encode(kind: str, payload: dict[str, Any]) -> str:
    return f"{PREFIX}{kind} {json.dumps(payload, separators=(',', ':'), default=str)}\n"


_stdout_lock = threading.Lock()


def emit(kind: str, payload: dict[str, Any]) -> None:
    """Write one event on the child's stdout, in one write under a lock (threads never interleave their lines)."""
    line = encode(kind, payload)
    with _stdout_lock:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):  # the JVM relaying our stdout is gone; nobody is listening
            pass


def decode(line: str) -> tuple[str, dict[str, Any]] | None:
    """(kind, payload) for an event line, None for a log line (or a garbled event)."""
    if not line.startswith(PREFIX):
        return None
    kind, _, body = line[len(PREFIX) :].partition(" ")
    if kind not in KINDS:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return (kind, payload) if isinstance(payload, dict) else None
