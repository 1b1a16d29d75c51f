"""The ids a log line is about (item, task, attempt, queue, worker, workflow, Spark run), carried in a context
variable and copied onto every log record by a logging filter, so a line logged anywhere under a handler call (the
handler's own, the engine's, the Spark launcher's) says which attempt it belongs to. With LOG_FORMAT=json
(jobsite/settings.py's LOGGING) each id is a key of the line's JSON object; the plain format leaves them out.

- `log_context(**ids)`: a context manager; the worker wraps each handler call in `attempt_context(...)`, the Spark
  run handler adds the run's id.
- `bind_process(**ids)`: ids of the whole process (the worker's id, set once at its start), under every thread's
  context, forked pool children included.
- `ContextFilter`: on the console handler; a record's own attribute (`extra=`) wins over the context's.

Traces (issue 40, later): `trace_id` and `span_id` belong here too, as keys of FIELDS set from the current span.
"""

import logging
from contextvars import ContextVar
from typing import Any, Protocol

# Every id a line may carry, in the order the JSON shows them. Add "trace_id", "span_id" with traces.
FIELDS = ("item_id", "task", "attempt", "queue", "worker_id", "workflow_id", "spark_run_id")

_context: ContextVar[dict[str, Any]] = ContextVar("jobsite_log_context", default={})  # noqa: B039 — never mutated
_process: dict[str, Any] = {}


def _checked(ids: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(ids) - set(FIELDS))
    if unknown:
        raise TypeError(f"unknown log context ids {unknown}; known: {', '.join(FIELDS)}")
    return {key: value for key, value in ids.items() if value is not None}


class log_context:  # noqa: N801 — used as a function: `with log_context(item_id=...)`
    """Within the block, every log record of this thread (or task) carries `ids`, over the outer block's. A class
    rather than @contextmanager: the worker enters one per item (1.8 us with its ids on a loaded 2-core machine,
    where @contextmanager took 3.8 us)."""

    __slots__ = ("ids", "token")

    def __init__(self, **ids: Any) -> None:
        self.ids = _checked(ids)

    @classmethod
    def of(cls, ids: dict[str, Any]) -> "log_context":
        """One over ids known to be FIELDS, unchecked (the worker's, per item)."""
        made = cls.__new__(cls)
        made.ids = ids
        return made

    def __enter__(self) -> None:
        outer = _context.get()
        self.token = _context.set({**outer, **self.ids} if outer else self.ids)  # the dicts are never mutated

    def __exit__(self, *exc: object) -> None:
        _context.reset(self.token)


class Attempt(Protocol):
    """What a Lease, a worker Job and a handler's Context have in common."""

    item_id: int
    task: str
    attempt: int
    queue: str


def attempt_ids(attempt: Attempt) -> dict[str, Any]:
    """The ids of one attempt (item, task, attempt, queue): a context's, or a log call's `extra`."""
    return {"item_id": attempt.item_id, "task": attempt.task, "attempt": attempt.attempt, "queue": attempt.queue}


def attempt_context(attempt: Attempt) -> log_context:
    """log_context with an attempt's ids: what the worker wraps a handler call in."""
    return log_context.of(attempt_ids(attempt))


def bind_process(**ids: Any) -> None:
    """Ids every record of this process carries from now on (under any context's)."""
    _process.update(_checked(ids))


def current() -> dict[str, Any]:
    """The ids a record logged here and now would carry."""
    return {**_process, **_context.get()}


class ContextFilter(logging.Filter):
    """Copies the current ids onto each record it sees (as attributes the JSON formatter writes as keys)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in current().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
