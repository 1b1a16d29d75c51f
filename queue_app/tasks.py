"""queue_app's built-in tasks, used by demos, benchmarks and tests:

- `queue_app.noop`, `queue_app.echo` (returns its payload), `queue_app.sleep` (`{"seconds": x}`),
  `queue_app.fail` (always raises; retried with backoff, then a dead letter);
- the probes, one per delivery mode (`queue_app.probe`, `queue_app.probe_at_most_once`,
  `queue_app.probe_transactional`), in queue_app/probes/ with their tables;
- and, imported at the end, the tasks of the app's packages (prune, the probes). A layer app's tasks are in its
  own tasks.py (the Spark runs', the workflows', the webhooks', the datasets'), found because the app is installed.

The registry itself (`@job`, `Task`, `Retry`) is queue_app.registry.
"""

import math
import time
from typing import Any

from .registry import Context, Retry, job


class TaskFailed(Exception):
    """Raised on purpose by queue_app.fail."""


@job("queue_app.noop")
def noop(payload: Any, ctx: Context) -> None:
    return None


@job("queue_app.echo")
def echo(payload: Any, ctx: Context) -> Any:
    return payload


def _seconds(payload: Any) -> float:
    seconds = payload.get("seconds") if isinstance(payload, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise ValueError(f'expected {{"seconds": <number >= 0>}}, got {payload!r}')
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds!r}")
    return float(seconds)


@job("queue_app.sleep", hard_timeout=30.0, decode=_seconds)
def sleep(seconds: float, ctx: Context) -> dict[str, float]:
    time.sleep(seconds)
    return {"slept": seconds}


@job("queue_app.fail", retry=Retry(times=3))
def fail(payload: Any, ctx: Context) -> None:
    message = payload.get("message") if isinstance(payload, dict) else None
    raise TaskFailed(message or f"queue_app.fail always fails (attempt {ctx.attempt})")


from . import maintenance_tasks as _maintenance_tasks  # noqa: E402, F401  registers queue_app.prune
from .probes import tasks as _probes  # noqa: E402, F401  registers the probes
