"""The task registry: `@job(...)` registers a handler under a name with its options (a frozen `Task`), and the
worker finds it with `get_task(name)`. Every installed app's `tasks.py` is imported on the first lookup, so
task modules need no configuration. queue_app's own built-in tasks live in queue_app/tasks.py.

    from queue_app.registry import Retry, job

    @job("billing.charge", queue="billing", retry=Retry(times=3, on=(TimeoutError,)), hard_timeout=20)
    def charge(payload, ctx):
        # ctx.item_id is the idempotency key: the same item may be delivered again (at-least-once)
        ...

    charge.enqueue({"order": 42})
"""

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import engine
from .conf import queue_settings
from .engine import sql_api
from .engine.alias import queue_db
from .engine.errors import QueueError
from .registries import Registry, origin_of

logger = logging.getLogger("jobsite.worker")

# A lease is always longer than the hard timeout by at least this much, so the worker has stopped a runaway
# handler (and settled its attempt) before anyone else may take the item.
LEASE_MARGIN = 2.0
DEFAULT_HARD_TIMEOUT = 30.0


def _check_seconds(name: str, value: Any, *, allow_none: bool = False, allow_zero: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, not {value!r}")


class Delivery(StrEnum):
    """When the worker settles an item relative to running its handler (see DESIGN.md, Guarantees)."""

    AT_LEAST_ONCE = "at_least_once"  # run, then settle: a crash in between re-delivers
    AT_MOST_ONCE = "at_most_once"  # settle, then run: a crash or error is recorded, never retried
    TRANSACTIONAL = "transactional"  # handler and settle in one transaction: a lost lease rolls both back


@dataclass(frozen=True, slots=True)
class Retry:
    """A task's retry policy (Sentry's taskworker `Retry`): which failures are retried, how often, how soon.

    `times`: attempts in all, the first included (None: the item's queue decides). `on`: exceptions that are
    retried; `ignore`: exceptions never retried, even when they match `on`: the item goes straight to the dead
    letters. `delay`: fixed seconds between attempts; None means exponential backoff with jitter from
    `backoff_base`, capped at `backoff_max` (the JOBSITE settings when None). An exception that carries a
    numeric `retry_in` attribute (seconds, >= 0) sets the delay of that retry itself (a Spark run's per-job
    backoff, spark/policy.py).
    """

    times: int | None = None
    on: tuple[type[BaseException], ...] = (Exception,)
    ignore: tuple[type[BaseException], ...] = ()
    delay: float | None = None
    backoff_base: float | None = None
    backoff_max: float | None = None
    schedule: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.times is not None and (isinstance(self.times, bool) or not isinstance(self.times, int)):
            raise TypeError(f"Retry.times must be an integer or None, not {self.times!r}")
        if self.times is not None and self.times < 1:
            raise ValueError(f"Retry.times counts every attempt and must be at least 1, not {self.times}")
        for name in ("on", "ignore"):
            kinds = getattr(self, name)
            if not isinstance(kinds, tuple) or not all(
                isinstance(k, type) and issubclass(k, BaseException) for k in kinds
            ):
                raise TypeError(f"Retry.{name} must be a tuple of exception classes, not {kinds!r}")
        for name in ("delay", "backoff_base", "backoff_max"):
            _check_seconds(f"Retry.{name}", getattr(self, name), allow_none=True, allow_zero=True)
        if self.schedule is not None:
            if not isinstance(self.schedule, tuple) or not self.schedule:
                raise TypeError(f"Retry.schedule must be a non-empty tuple of seconds, not {self.schedule!r}")
            for seconds in self.schedule:
                _check_seconds("Retry.schedule entry", seconds, allow_zero=True)
            if self.delay is not None:
                raise ValueError("Retry takes a fixed delay or a schedule, not both")

    def should_retry(self, exc: BaseException) -> bool:
        return isinstance(exc, self.on) and not isinstance(exc, self.ignore)

    def retry_in(self, attempt: int) -> float:
        """Seconds before the next attempt after attempt number `attempt` failed."""
        if self.delay is not None:
            return self.delay
        if self.schedule is not None:
            return float(self.schedule[min(max(attempt, 1), len(self.schedule)) - 1])
        return engine.backoff_seconds(attempt, base=self.backoff_base, cap=self.backoff_max)


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler is told about the attempt it runs. `item_id` is the idempotency key: an at-least-once
    item can run more than once, always under the same item id. Also a `Held` for the engine's settle calls."""

    item_id: int
    reservation_id: int
    attempt: int
    max_attempts: int
    task: str
    queue: str
    delivery: Delivery
    worker_id: str

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def extend_lease(self, seconds: float) -> datetime:
        """Push this attempt's lease deadline to now + `seconds` (the worker renews leases anyway; its renewals
        never shorten this). Raises StaleReservation when the item was cancelled or taken away: the handler
        should stop, its outcome will not be recorded. The hard timeout still applies."""
        return engine.extend(self, seconds)


Handler = Callable[[Any, Context], Any]


@dataclass(frozen=True, slots=True)
class ChunkPolicy:
    """A chunked task (`@job(chunk=ChunkPolicy(size=100, timeout=1.0))`): its handler is called once with a list
    of up to `size` items, `handler(items: list[ChunkItem]) -> list | None`. The worker hands it the task's items
    it holds, waiting up to `timeout` seconds for a partial chunk to fill while its lease may bring more. Each
    item is leased, counted against rate and group limits, and settled on its own (own attempts, dead letters,
    fencing): the handler returns one outcome per item, in order: a result (done), ItemRetry(error) (a failed
    attempt, retried while attempts are left) or ItemDead(error) (straight to the dead letters); None: all done.
    A handler that raises fails every item of the chunk."""

    size: int = 100
    timeout: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"ChunkPolicy.size must be an integer >= 1, not {self.size!r}")
        _check_seconds("ChunkPolicy.timeout", self.timeout, allow_zero=True)


class ChunkItem(NamedTuple):
    """One item of a chunk: its payload (decoded) and the context of its attempt."""

    payload: Any
    ctx: Context


class ItemRetry(NamedTuple):
    """A chunk handler's outcome for one item: this attempt failed with `error`; retried while attempts are left
    (the task's Retry decides when)."""

    error: str


class ItemDead(NamedTuple):
    """A chunk handler's outcome for one item: it can never succeed; to the dead letters with `error`."""

    error: str


class Settled(NamedTuple):
    """What a handler returns when it settled its own item (engine.complete, fail or dead, fenced on ctx's
    reservation) in the transaction that recorded its work, so that no reader sees that work final while the item
    is still held (a Spark run's end: spark/runs.py). The worker settles nothing more; it counts the outcome.
    `fate`: "done", "retry" or "dead" (what the settle did); `error`: a failure's text; `retry_in`: seconds until
    a retry is due."""

    result: Any = None
    fate: str = "done"
    error: str = ""
    retry_in: float | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """A registered handler and its options. Build it with `@job(...)`.

    An item of this task runs under a lease of `lease_timeout` seconds (None: the item's own, else its queue's),
    never shorter than `min_lease` = hard timeout + LEASE_MARGIN; the worker sets it when it starts the item
    and renews it while the handler runs.
    """

    name: str
    func: Handler = field(repr=False)
    queue: str | None = None  # None: the JOBSITE DEFAULT_QUEUE
    delivery: Delivery = Delivery.AT_LEAST_ONCE
    retry: Retry = Retry()
    hard_timeout: float = DEFAULT_HARD_TIMEOUT
    lease_timeout: float | None = None  # None: the item's or its queue's, raised to min_lease if shorter
    dedup_window: float | None = None  # None: the JOBSITE DEDUP_WINDOW
    decode: Callable[[Any], Any] | None = field(default=None, repr=False)
    # Called once in each worker process that serves this task's queue, before its first item (see job()).
    warm_up: Callable[[], None] | None = field(default=None, repr=False)
    chunk: ChunkPolicy | None = None  # None: one item per handler call
    # Datasets this task writes: it is their producer (datasets/producers.py), and an item started for one of
    # them (payload {"dataset", "partition", ...}) records its materialization when it succeeds.
    produces: tuple[str, ...] = ()

    @property
    def min_lease(self) -> float:
        """The shortest lease this task's items may run under: hard timeout plus margin."""
        return self.hard_timeout + LEASE_MARGIN

    @property
    def max_attempts(self) -> int | None:
        """Attempts an item of this task gets in all (None: its queue's). At-most-once: 1, never retried; an
        item whose worker died between lease and settle (its handler never ran) becomes a dead letter."""
        return 1 if self.delivery is Delivery.AT_MOST_ONCE else self.retry.times

    def problems(self) -> list[str]:
        """Why a worker must refuse to run this task (empty when it may)."""
        if self.lease_timeout is not None and self.lease_timeout <= self.min_lease:
            return [
                f"task {self.name!r}: lease_timeout={self.lease_timeout:g}s is not longer than its hard timeout "
                f"({self.hard_timeout:g}s) plus the {LEASE_MARGIN:g}s margin, so its lease could expire under a "
                f"live handler; give it lease_timeout > {self.min_lease:g} or a shorter hard_timeout"
            ]
        return []

    def item_defaults(self) -> dict[str, Any]:
        """What an item of this task is created with unless the enqueue says otherwise: derived from the
        declaration (delivery mode -> attempts) here and nowhere else (see item_defaults below)."""
        return {
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "dedup_window": self.dedup_window,
            "at_most_once": self.delivery is Delivery.AT_MOST_ONCE,
        }

    def enqueue(self, payload: Any = None, **options: Any) -> engine.Enqueued:
        """engine.enqueue() of this task (its queue, attempts and dedup window unless options say otherwise)."""
        return engine.enqueue(self.name, payload, **options)

    def enqueue_many(self, payloads: Iterable[Any], **options: Any) -> list[int]:
        """engine.enqueue_many() of this task (its queue and attempts unless options say otherwise)."""
        return engine.enqueue_many(self.name, payloads, **options)

    def __call__(self, payload: Any, ctx: Context) -> Any:
        return self.func(payload, ctx)


class UnknownTask(QueueError, LookupError):
    """No task is registered under this name in this process."""


# Every installed app's `tasks.py` registers its tasks (queue_app's own: queue_app/tasks.py).
_tasks: Registry[Task] = Registry("task", app_module="tasks", origin=lambda task: origin_of(task.func))
_resolved: dict[str, Task] = {}
# Where a name no @job registered is looked up next: import paths of `(name) -> Task | None` callables.
# django.tasks functions enqueued through jobsite's backend are stored under their module path.
RESOLVERS: list[str] = ["queue_app.tasks_backend.job_spec_for"]


def job(
    name: str | None = None,
    *,
    queue: str | None = None,
    delivery: Delivery | str = Delivery.AT_LEAST_ONCE,
    retry: Retry | None = None,
    hard_timeout: float = DEFAULT_HARD_TIMEOUT,
    lease_timeout: float | None = None,
    dedup_window: float | None = None,
    decode: Callable[[Any], Any] | None = None,
    warm_up: Callable[[], None] | None = None,
    chunk: ChunkPolicy | None = None,
    produces: Iterable[str] = (),
) -> Callable[[Handler], Task]:
    """Register the decorated `handler(payload, ctx)` as a task named `name` (default: module.qualname).

    `decode(payload)` may turn the stored JSON into what the handler takes; if it raises, the item is
    poison and goes to the dead letters ("undecodable payload: ..."). It runs in the worker before the item
    is started, and again where the handler runs, so it must be a pure function.

    `warm_up()` is called once in each process where a worker serving the task's queue runs handlers (each
    child of the process pool, the thread pool's process), before its first item: it may start what the
    first item would otherwise wait for (the Spark run task starts its waiting light child). It must be quick
    and may not fail the worker: an exception is logged and the worker goes on.

    `chunk=ChunkPolicy(size, timeout)`: the handler takes a list of items at once (see ChunkPolicy); at-least-once
    or at-most-once delivery only.

    `produces=["events"]`: the task is the producer of those datasets (`dataset materialize`, a stale dataset's
    producer): started with payload {"dataset", "partition", "params", "reason"}, and its success records the
    partition's materialization (files counted at the location, `rows` from a result {"rows": N}), in the
    transaction that settles it for a transactional task, else right after the handler returns.
    """
    delivery = Delivery(delivery)
    produces = (produces,) if isinstance(produces, str) else tuple(produces)
    if not all(isinstance(n, str) and n for n in produces):
        raise TypeError(f"produces names datasets, not {produces!r}")
    if produces and chunk is not None:
        raise ImproperlyConfigured("a chunked task cannot produce datasets (each item would be a partition)")
    _check_seconds("hard_timeout", hard_timeout)
    _check_seconds("lease_timeout", lease_timeout, allow_none=True)
    _check_seconds("dedup_window", dedup_window, allow_none=True)
    retry = Retry() if retry is None else retry
    if not isinstance(retry, Retry):
        raise TypeError(f"retry must be a Retry, not {retry!r}")
    if delivery is Delivery.AT_MOST_ONCE and retry.times not in (None, 1):
        raise ImproperlyConfigured(f"an at-most-once task is never retried: Retry(times={retry.times}) contradicts it")

    if chunk is not None and not isinstance(chunk, ChunkPolicy):
        raise TypeError(f"chunk must be a ChunkPolicy, not {chunk!r}")
    if chunk is not None and delivery is Delivery.TRANSACTIONAL:
        raise ImproperlyConfigured("a chunked task runs at least once or at most once, not transactionally")

    def register(func: Handler) -> Task:
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        task = Task(
            name=task_name,
            func=func,
            queue=queue,
            delivery=delivery,
            retry=retry,
            hard_timeout=float(hard_timeout),
            lease_timeout=None if lease_timeout is None else float(lease_timeout),
            dedup_window=dedup_window,
            decode=decode,
            warm_up=warm_up,
            chunk=chunk,
            produces=produces,
        )
        return _tasks.register(task_name, task)

    return register


def warm_ups_for(queues: Iterable[str] | None) -> list[Callable[[], None]]:
    """The warm-ups of the registered tasks whose queue is one of `queues` (None: every queue), each once."""
    served = None if queues is None else set(queues)
    found: list[Callable[[], None]] = []
    for task in _tasks.entries().values():
        queue = task.queue or queue_settings.DEFAULT_QUEUE
        if task.warm_up is not None and (served is None or queue in served) and task.warm_up not in found:
            found.append(task.warm_up)
    return found


def get_task(name: str) -> Task:
    task = find_task(name)
    if task is None:
        raise UnknownTask(f"unknown task: {name}")
    return task


def find_task(name: str) -> Task | None:
    """The task registered as `name`, else what a resolver makes of the name, else None."""
    task = _tasks.get(name) or _resolved.get(name)
    if task is None:
        for path in RESOLVERS:
            try:
                task = import_string(path)(name)
            except Exception:  # a resolver that fails on a strange name must not stop the worker
                logger.warning("task resolver %s failed on %r", path, name, exc_info=True)
                continue
            if task is not None:
                _resolved[name] = task
                break
    return task


_unresolvable: set[str] = set()  # names no resolver knew when asked for their defaults (never asked again)


def item_defaults(name: str) -> dict[str, Any] | None:
    """The one source of an item's delivery-derived defaults: its task's declaration, whatever path creates the
    item (engine.enqueue and enqueue_many, Task.enqueue, the enqueue command, schedules, admin requeue,
    django.tasks). None for a name no task here declares (the queue's defaults then apply)."""
    task = _tasks.get(name) or _resolved.get(name)
    if task is None and name not in _unresolvable:
        task = find_task(name)
        if task is None:
            _unresolvable.add(name)
    return None if task is None else task.item_defaults()


engine.use_task_defaults(item_defaults)


def registered_tasks() -> dict[str, Task]:
    return _tasks.entries()


def publish_declarations(using: str | None = None, **_: Any) -> None:
    """Publish the registered tasks' item defaults (and jobsite's settings) where the SQL API's jobsite_enqueue
    reads them: the database cannot read the @job declarations, so each process that declares tasks writes them
    (after `migrate`: post_migrate; a worker or a deploy step may call it too)."""
    if using is not None and using != queue_db():  # `migrate --database` of another alias: no table of ours
        return
    sql_api.publish({name: task.item_defaults() for name, task in _tasks.entries().items()}, using=using)
