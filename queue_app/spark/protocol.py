"""The line protocol between a Spark run's child process (child.py) and its launcher (launcher.py).

The child writes one event per line on stdout as `JOBSITE-<KIND> <json>`; every other line the run prints
(Python logging, Spark's log4j on stderr) is a log line. Each event line goes out in a single write(), so lines
from several threads never interleave. The final result does not travel on stdout: the child writes it to the
`--output-file`, where a large payload cannot be cut by a dying pipe.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "JOBSITE-"
STARTED = "STARTED"  # {"app_id", "master", "pid", "spark_version", "setup_seconds"}: the session is up
PROGRESS = "PROGRESS"  # {"jobs_done", "jobs_total", "stages_done", ..., "tasks_done", "tasks_total", ...}
KINDS = (STARTED, PROGRESS)

# Exit codes of child.py; spark-submit passes a Python app's non-zero exit code through as its own.
EXIT_FAILED = 1
EXIT_BAD_PARAMS = 64  # sysexits EX_USAGE
EXIT_CANCELLED = 75  # sysexits EX_TEMPFAIL: SIGTERM received, job group cancelled


def encode(kind: str, payload: dict[str, Any]) -> str:
    return f"{PREFIX}{kind} {json.dumps(payload, separators=(',', ':'), default=str)}\n"


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
