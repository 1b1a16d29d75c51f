"""enqueue() and enqueue_many(): validate, then write in one round trip (COPY for bulk), NOTIFY on commit.

NOTIFY is sent inside the caller's transaction; PostgreSQL delivers it only at commit and folds repeats of the
same (channel, queue) within one transaction, so a rolled-back enqueue never wakes a worker.
"""

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from ..conf import queue_settings
from . import handoff, sql, tracing
from .alias import atomic, cross_database_guard
from .db import cursor
from .errors import InvalidEnqueue
from .payload import encode_json

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
COPY_CHUNK = 5_000  # rows per write to the COPY stream
_COPY_NULL = "\\N"
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: str) -> str:
    """`value` as a field of COPY's text format (backslash, tab, newline and carriage return escaped)."""
    return value.translate(_COPY_ESCAPES)


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    queue: str
    task: str
    run_at: datetime | None
    duplicate: bool
    # As stored (the enqueuing transaction's start time, PostgreSQL's now()), not the client's clock: what a
    # later read of the item returns.
    created_at: datetime | None = None
    # Debounce: how many enqueues of its key the item has absorbed so far (0: this enqueue created it).
    absorbed: int = 0


def _number(name: str, value: Any, *, minimum: float, integer: bool = False) -> Any:
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise InvalidEnqueue(f"{name} must be {'an integer' if integer else 'a number'}, not {value!r}")
    if not math.isfinite(value) or value < minimum:
        raise InvalidEnqueue(f"{name} must be a finite number >= {minimum}, not {value!r}")
    return value


def _is_storable_text(value: Any) -> bool:
    """A non-empty str of at most 200 characters that PostgreSQL text can hold: UTF-8 (no lone surrogate),
    no NUL."""
    if not isinstance(value, str) or not value or len(value) > 200 or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_task_name(value: Any) -> bool:
    """What a task name may be: see _is_storable_text."""
    return _is_storable_text(value)


def is_group_key(value: Any) -> bool:
    """What a group key (or ordering or dedup key) may be: see _is_storable_text."""
    return _is_storable_text(value)


def _key(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not _is_storable_text(value):
        raise InvalidEnqueue(
            f"{name} must be a non-empty UTF-8 string of at most 200 characters without NUL, not {value!r}"
        )
    return value


# Where enqueue() reads a task's declared defaults (queue, max_attempts, dedup window) by its name: the
# registry's item_defaults, installed when the app is ready (the registry imports the engine, not the other way).
# Every path that creates an item goes through enqueue() or enqueue_many(), so each takes them from there.
TaskDefaults = Callable[[str], Mapping[str, Any] | None]
_task_defaults: TaskDefaults | None = None


def use_task_defaults(source: TaskDefaults | None) -> None:
    global _task_defaults
    _task_defaults = source


def _declared(task: str) -> Mapping[str, Any]:
    return (_task_defaults(task) if _task_defaults is not None else None) or {}


def _queue_defaults() -> dict[str, Any]:
    """Parameters of sql.ENSURE_QUEUE: the settings a queue is created with when an enqueue first names it."""
    return {
        "queue_lease_timeout": float(queue_settings.DEFAULT_LEASE_TIMEOUT),
        "queue_max_attempts": int(queue_settings.DEFAULT_MAX_ATTEMPTS),
        "queue_retention": timedelta(days=queue_settings.DEFAULT_RETENTION_DAYS),
    }


def _params(
    task: str,
    *,
    queue: str | None,
    priority: int,
    run_at: datetime | None,
    delay: float | timedelta | None,
    ordering_key: str | None,
    group_key: str | None,
    max_attempts: int | None,
    lease_timeout: float | None,
) -> dict[str, Any]:
    if not is_task_name(task):
        raise InvalidEnqueue(f"task must be a non-empty UTF-8 name of at most 200 characters without NUL, not {task!r}")
    declared = _declared(task)
    if queue is None:
        queue = declared.get("queue") or queue_settings.DEFAULT_QUEUE
    if declared.get("at_most_once") and max_attempts not in (None, 1):
        raise InvalidEnqueue(
            f"{task} is an at-most-once task, never retried: max_attempts={max_attempts!r} contradicts it"
        )
    if max_attempts is None:
        max_attempts = declared.get("max_attempts")
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise InvalidEnqueue(f"queue name must match {QUEUE_NAME.pattern}, not {queue!r}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise InvalidEnqueue(f"priority must be an integer from -100 to 100, not {priority!r}")
    if run_at is not None and delay is not None:
        raise InvalidEnqueue("give run_at or delay, not both")
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise InvalidEnqueue(f"run_at must be a timezone-aware datetime, not {run_at!r}")
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    delay = _number("delay", delay, minimum=0)
    return {
        "queue": queue,
        "task": task,
        "priority": priority,
        "run_at": run_at,
        "delay": float(delay or 0),
        "ordering_key": _key("ordering_key", ordering_key),
        "group_key": _key("group_key", group_key),
        "max_attempts": _number("max_attempts", max_attempts, minimum=1, integer=True),
        "lease_timeout": _number("lease_timeout", lease_timeout, minimum=0.001),
        "channel": queue_settings.NOTIFY_CHANNEL,
        **_queue_defaults(),
    }


def notify(queues: Iterable[str], using: str | None = None) -> None:
    """Wake the workers of `queues` (NOTIFY, delivered at commit): an item of theirs became leasable without an
    enqueue (an ordering key unblocked by a settle)."""
    with cursor(using) as cur:
        for queue in sorted(set(queues)):
            cur.execute(sql.NOTIFY, {"channel": queue_settings.NOTIFY_CHANNEL, "queue": queue})


def ensure_queue(name: str, using: str | None = None) -> None:
    """Create the queue row with defaults if it does not exist yet. enqueue() and enqueue_many() do this in
    their own statement (sql.ENSURE_QUEUE as a CTE); this is for callers that need the row without an item."""
    with cursor(using) as cur:
        cur.execute(sql.ENSURE_QUEUE, {"queue": name, **_queue_defaults()})


def enqueue(
    task: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    dedup_key: str | None = None,
    dedup_window: float | timedelta | None = None,
    ordering_key: str | None = None,
    group_key: str | None = None,
    max_attempts: int | None = None,
    lease_timeout: float | None = None,
    debounce_key: str | None = None,
    debounce: float | timedelta | None = None,
    debounce_max: float | timedelta | None = None,
    using: str | None = None,
) -> Enqueued:
    """Queue one item. Joins the caller's transaction on the queue's database (CrossDatabaseEnqueue inside one on
    another alias only: engine/alias.py). With `dedup_key`, a second enqueue of the same key in the same queue
    within the window returns the first item with `duplicate=True` and writes nothing.
    `group_key` (a tenant or customer id): a fair queue leases its keys in turn, and a queue's group limit caps
    the items of one key in flight (see flow.py). With `debounce_key` and `debounce` (seconds), the enqueues of
    one key collapse into one ready item that runs once the key has been quiet for `debounce` seconds, or
    `debounce_max` seconds after the first of them, with the latest payload (see _debounce)."""
    params = _params(
        task,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        ordering_key=ordering_key,
        group_key=group_key,
        max_attempts=max_attempts,
        lease_timeout=lease_timeout,
    )
    params["payload"] = encode_json({} if payload is None else payload)
    cross_database_guard(using)
    if debounce_key is not None or debounce is not None or debounce_max is not None:
        if dedup_key is not None:
            raise InvalidEnqueue("give dedup_key (keep the first) or debounce_key (keep the latest), not both")
        return _debounce(params, debounce_key, debounce, debounce_max, using)
    if dedup_key is not None:
        params["dedup_key"] = _key("dedup_key", dedup_key)
        if isinstance(dedup_window, timedelta):
            dedup_window = dedup_window.total_seconds()
        if dedup_window is None:
            dedup_window = _declared(task).get("dedup_window")
        window = queue_settings.DEDUP_WINDOW if dedup_window is None else dedup_window
        params["dedup_window"] = float(_number("dedup_window", window, minimum=0.001))
    if tracing.enabled:  # a producer span around the write; the item stores its context
        with tracing.producer(task, params["queue"]) as span:
            params["trace_context"] = tracing.traceparent(span)
            found = _write_one(params, task, dedup_key, using)
            span.set_attribute("jobsite.item_id", found.id)
            span.set_attribute("jobsite.duplicate", found.duplicate)
            return found
    return _write_one(params, task, dedup_key, using)


def _write_one(params: dict[str, Any], task: str, dedup_key: str | None, using: str) -> Enqueued:
    if dedup_key is None:
        # One statement (queue row, item, NOTIFY): atomic by itself, so no transaction block of its own — outside
        # the caller's transaction it commits in its own round trip; inside, it joins without a savepoint.
        # Outside one, a plain item may be handed to an idle worker in the same statement (engine/handoff.py).
        traced = "trace_context" in params
        eligible = not traced and handoff.eligible(params, using)
        if traced:
            statement = sql.ENQUEUE_TRACED
        elif eligible:
            statement = handoff.statement(params["queue"])
        else:
            statement = sql.ENQUEUE
        with cursor(using) as cur:
            cur.execute(statement, params)
            row = cur.fetchone()
        if eligible:
            handoff.saw(params["queue"], row[3])
        return Enqueued(row[0], params["queue"], task, row[1], duplicate=False, created_at=row[2])
    while True:
        with atomic(using), cursor(using) as cur:
            cur.execute(sql.ENQUEUE_DEDUP if "trace_context" not in params else sql.ENQUEUE_DEDUP_TRACED, params)
            row = cur.fetchone()
            if row is not None:
                return Enqueued(row[0], params["queue"], task, row[1], duplicate=False, created_at=row[2])
            cur.execute(sql.DEDUP_OWNER, params)
            owner = cur.fetchone()
        if owner is not None:
            break
        # The claim vanished between the two statements (its window ended and it was pruned): claim again.
    return Enqueued(owner[0], params["queue"], task, owner[1], duplicate=True, created_at=owner[2])


def _seconds(name: str, value: float | timedelta | None, *, minimum: float) -> float | None:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    value = _number(name, value, minimum=minimum)
    return None if value is None else float(value)


def _debounce(
    params: dict[str, Any],
    debounce_key: str | None,
    debounce: float | timedelta | None,
    debounce_max: float | timedelta | None,
    using: str,
) -> Enqueued:
    """The debounced enqueue (sql.ENQUEUE_DEBOUNCE): a new ready item for the key, or the key's ready item with
    this payload, due `debounce` seconds from now (never later than its maximum wait), one more absorbed."""
    if debounce_key is None or debounce is None:
        raise InvalidEnqueue("a debounced enqueue takes both debounce_key and debounce (seconds)")
    params["debounce_key"] = _key("debounce_key", debounce_key)
    params["debounce"] = _seconds("debounce", debounce, minimum=0.001)
    params["debounce_max"] = _seconds("debounce_max", debounce_max, minimum=0.001)
    if params["debounce_max"] is not None and params["debounce_max"] < params["debounce"]:
        raise InvalidEnqueue(
            f"debounce_max ({params['debounce_max']} s) must be at least debounce ({params['debounce']} s)"
        )
    if params["run_at"] is not None or params["delay"]:
        raise InvalidEnqueue("a debounced item is due when its key goes quiet: give debounce, not run_at or delay")
    with cursor(using) as cur:
        cur.execute(sql.ENQUEUE_DEBOUNCE, params)
        row = cur.fetchone()
    if row is None:
        raise InvalidEnqueue(
            f"debounce key {debounce_key!r} is held by a ready item of another task in queue {params['queue']!r}"
        )
    return Enqueued(
        row[0], params["queue"], params["task"], row[1], duplicate=False, created_at=row[2], absorbed=row[3]
    )


def enqueue_many(
    task: str,
    payloads: Iterable[Any],
    *,
    queue: str | None = None,
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    ordering_key: str | None = None,
    group_key: str | None = None,
    max_attempts: int | None = None,
    lease_timeout: float | None = None,
    using: str | None = None,
) -> list[int]:
    """Queue many items of one task with COPY; all payloads are validated before anything is written.
    Returns the new item ids in payload order. Dedup keys are per item: use enqueue() for those."""
    params = _params(
        task,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        ordering_key=ordering_key,
        group_key=group_key,
        max_attempts=max_attempts,
        lease_timeout=lease_timeout,
    )
    encoded = [encode_json({} if p is None else p) for p in payloads]
    if not encoded:
        return []
    cross_database_guard(using)
    if tracing.enabled:  # one producer span for the batch, linked to the items' own traces (tracing.bulk_items)
        with tracing.producer(task, params["queue"], len(encoded)) as span:
            contexts = partial(tracing.bulk_items, span, task, params["queue"])
            return _copy_many(params, task, priority, encoded, contexts, using)
    return _copy_many(params, task, priority, encoded, None, using)


def _copy_many(
    params: dict[str, Any],
    task: str,
    priority: int,
    encoded: list[str],
    contexts: Callable[[list[int]], list[str]] | None,
    using: str,
) -> list[int]:
    """COPY the items in. `contexts(ids)`: the trace context each item stores (tracing on), else none."""
    with atomic(using), cursor(using) as cur:
        cur.execute(
            sql.ALLOCATE_IDS,
            {"n": len(encoded), "queue": params["queue"], "group_key": params["group_key"], **_queue_defaults()},
        )
        now, ids, queue_max_attempts, group_key = cur.fetchone()
        attempts = params["max_attempts"] or queue_max_attempts
        # COPY's text format, built here: the columns every row shares are formatted once, and a row is one
        # f-string, instead of adapting a dozen values per row.
        head = f"\t{_copy_text(params['queue'])}\t{_copy_text(task)}\t"
        shared = [
            "ready",
            str(priority),
            "0",
            str(attempts),
            _COPY_NULL if params["lease_timeout"] is None else repr(float(params["lease_timeout"])),
            _COPY_NULL if params["ordering_key"] is None else _copy_text(params["ordering_key"]),
            _COPY_NULL if group_key is None else _copy_text(group_key),
            "",
        ]
        copy_items = sql.COPY_ITEMS
        if params["run_at"] is not None or params["delay"] > 0:
            due = params["run_at"] or now + timedelta(seconds=params["delay"])
            shared += [due.isoformat(), due.isoformat()]
            copy_items = sql.COPY_DELAYED_ITEMS
        # The trace context sits between the shared columns and the due times: one per item when traced.
        mid, due_times = "\t" + "\t".join(shared[:8]) + "\t", "".join("\t" + v for v in shared[8:]) + "\n"
        tail = f"{mid}{_COPY_NULL}{due_times}"
        traced = contexts(ids) if contexts is not None else None
        raw = cur.cursor  # psycopg's cursor: Django's wrapper has no COPY
        with raw.copy(copy_items) as copy:
            for start in range(0, len(ids), COPY_CHUNK):
                end = start + COPY_CHUNK
                # JSON text has no raw tab or newline (json.dumps escapes them); its backslashes are COPY's escape.
                if traced is None:
                    rows = zip(ids[start:end], encoded[start:end], strict=True)
                    copy.write("".join([f"{i}{head}{t.replace('\\', '\\\\')}{tail}" for i, t in rows]))
                else:
                    each = zip(ids[start:end], encoded[start:end], traced[start:end], strict=True)
                    copy.write("".join([f"{i}{head}{t.replace('\\', '\\\\')}{mid}{c}{due_times}" for i, t, c in each]))
        cur.execute(sql.NOTIFY, {"channel": params["channel"], "queue": params["queue"]})
    return ids
