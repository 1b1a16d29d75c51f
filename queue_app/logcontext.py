"""The ids a log line is about (item, task, attempt, queue, worker, workflow, Spark run), carried in a context
variable and copied onto every log record by a logging filter, so a line logged anywhere under a handler call (the
handler's own, the engine's, the Spark launcher's) says which attempt it belongs to. With LOG_FORMAT=json
(jobsite/settings.py's LOGGING) each id is a key of the line's JSON object; the plain format leaves them out.

- `log_context(**ids)`: a context manager (the Spark run handler adds the run's id with it).
- `attempt_context(attempt, workflow_id, step)`: the one the worker wraps each handler call in: the attempt's
  item, task, attempt number and queue; for a workflow step's item, its workflow's id and the step's name
  (`workflow_step`), which the worker knows from its traced lease (taken with tracing on and with
  LOG_FORMAT=json: worker/leasing.py; engine/sql.py's _LEASED_COLUMNS_TRACED).
- `bind_process(**ids)`: ids of the whole process (the worker's id, set once at its start), under every thread's
  context, forked pool children included.
- `ContextFilter`: on the console handler; a record's own attribute (`extra=`) wins over the context's.

With tracing on (engine/tracing.py), a record also carries the current span's `trace_id` and `span_id` (a
handler's lines: its attempt's span), read from OpenTelemetry's context only then.
"""

import logging
from contextvars import ContextVar
from typing import Any, Protocol

from .engine import tracing

# Every id a line may carry, in the order the JSON shows them.
FIELDS = (
    *("item_id", "task", "attempt", "queue", "worker_id", "workflow_id", "workflow_step", "spark_run_id"),
    *("trace_id", "span_id"),
)

_context: ContextVar[dict[str, Any]] = ContextVar("jobsite_log_context", default={})  # noqa: B039 — never mutated
_attempt: ContextVar[Any] = ContextVar("jobsite_log_attempt", default=None)  # the attempt a handler runs
_step: ContextVar[Any] = ContextVar("jobsite_log_step", default=None)  # (workflow id, step name) of a step's item
_process: dict[str, Any] = {}


def _checked(ids: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(ids) - set(FIELDS))
    if unknown:
        raise TypeError(f"unknown log context ids {unknown}; known: {', '.join(FIELDS)}")
    return {key: value for key, value in ids.items() if value is not None}


class log_context:  # noqa: N801 — used as a function: `with log_context(item_id=...)`
    """Within the block, every log record of this thread (or asyncio task) carries `ids`, over the outer block's."""

    __slots__ = ("ids", "token")

    def __init__(self, **ids: Any) -> None:
        self.ids = _checked(ids)

    def __enter__(self) -> None:
        self.token = _context.set({**_context.get(), **self.ids})

    def __exit__(self, *exc: object) -> None:
        _context.reset(self.token)


class Attempt(Protocol):
    """What a Lease, a worker Job and a handler's Context have in common."""

    item_id: int
    task: str
    attempt: int
    queue: str


def attempt_ids(attempt: Attempt) -> dict[str, Any]:
    """The ids of one attempt (item, task, attempt, queue): what a record logged under it carries, or a log
    call's `extra`."""
    return {"item_id": attempt.item_id, "task": attempt.task, "attempt": attempt.attempt, "queue": attempt.queue}


class attempt_context:  # noqa: N801 — used as a function: `with attempt_context(ctx)`
    """What the worker wraps a handler call in: the records logged inside carry the attempt's ids, and a
    workflow step's item's `workflow_id` and `workflow_step` when given. It keeps the attempt itself and the filter
    reads its ids, only for the records there are: entering and leaving cost 0.6 us an item on the loaded 2-core
    machine, where building the ids' dict each time (log_context) took 1.2 us and @contextmanager 3.8 us. An item
    that is no step sets nothing more."""

    __slots__ = ("attempt", "step", "step_token", "token")

    def __init__(self, attempt: Attempt, workflow_id: int | None = None, step: str | None = None) -> None:
        self.attempt = attempt
        self.step = None if workflow_id is None else (workflow_id, step)

    def __enter__(self) -> None:
        self.token = _attempt.set(self.attempt)
        if self.step is not None:
            self.step_token = _step.set(self.step)

    def __exit__(self, *exc: object) -> None:
        _attempt.reset(self.token)
        if self.step is not None:
            _step.reset(self.step_token)


def bind_process(**ids: Any) -> None:
    """Ids every record of this process carries from now on (under any context's)."""
    _process.update(_checked(ids))


def current() -> dict[str, Any]:
    """The ids a record logged here and now would carry: log_context's over the attempt's over the process's."""
    attempt = _attempt.get()
    if attempt is None:
        ids = {**_process, **_context.get()}
    else:
        ids = {**_process, **attempt_ids(attempt)}
        if (step := _step.get()) is not None:  # a workflow step's item
            ids["workflow_id"], ids["workflow_step"] = step
        ids.update(_context.get())
    if tracing.enabled:
        ids.update(tracing.current_ids())
    return ids


class ContextFilter(logging.Filter):
    """Copies the current ids onto each record it sees (as attributes the JSON formatter writes as keys)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in current().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
