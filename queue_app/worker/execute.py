"""Running one item's handler where the pool puts it (a child process or a thread): decode the payload, build
the handler's context, apply the delivery mode's rules around the call, and report an Outcome.

- at-least-once and at-most-once: call the handler; the supervisor settles (after, or already before).
- transactional: in one transaction, lock the item's row fenced on the reservation (stale: do not run), call
  the handler, settle the item done, commit. The handler's writes and the settle commit together or not at all.

A task declared with `produces=` records the materialization of the partition its item was started for after
its handler returns (datasets/producers.record_produced): in the transaction that settles it when transactional,
in one of its own before the settle otherwise (as a Spark run records its own in the transaction that marks it
succeeded); a record refused (nothing written at the location) fails the attempt.
"""

import threading
import traceback
from typing import Any, NamedTuple

from django.db import connections

from .. import engine, hooks
from ..engine import tracing
from ..engine.alias import atomic
from ..engine.errors import InvalidEnqueue, StaleReservation
from ..engine.payload import encode_json
from ..logcontext import attempt_context
from ..registry import ChunkItem, Context, Delivery, ItemDead, ItemRetry, Settled, Task, get_task


# Job and Outcome are named tuples, not frozen dataclasses: the worker makes one of each per item, and a frozen
# dataclass sets each field through object.__setattr__ (a few microseconds an item of a no-op's CPU budget).
class Job(NamedTuple):
    """One item handed to the pool: what the handler's context needs, and its payload as stored."""

    reservation_id: int
    item_id: int
    queue: str
    task: str
    payload: Any
    attempt: int
    max_attempts: int
    worker_id: str
    # The attempt's span (engine/tracing.py), as a traceparent: the handler runs under it, so its own spans and
    # what it enqueues are the attempt's children; a not-sampled attempt's: its item's stored context (flags 00),
    # carried so what it enqueues is not sampled either. None with tracing off.
    trace_parent: str | None = None
    # A workflow step's item: its workflow's id and the step's name, for its log lines (logcontext.py). Known from
    # the traced lease only (tracing on or JSON logs); None otherwise.
    workflow_id: int | None = None
    step: str | None = None


class Outcome(NamedTuple):
    """How running one job went.

    status: "ok" (handler returned `result`: the supervisor settles), "settled" (transactional: done and
    committed with the handler's writes; or a handler that returned registry.Settled: settled by itself, a
    failure's `error` set, `retryable` False when it went to the dead letters), "stale" (transactional: the
    reservation was no longer current, the handler's writes were not kept), "failed" (`error`, `traceback`;
    `retryable` by the task's Retry policy, `timed_out` when stopped at its hard timeout, `retry_in` when the
    exception named its own delay).
    """

    reservation_id: int
    status: str
    result: Any = None
    error: str = ""
    traceback: str = ""
    retryable: bool = True
    timed_out: bool = False
    # The exception's own `retry_in` attribute (seconds, finite and >= 0): the delay before the next attempt in
    # place of the task's Retry backoff (a Spark run's per-job backoff). None: the task's Retry decides.
    retry_in: float | None = None
    # The handler raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt): recorded like
    # any failure; a pool's child process then exits, as the handler asked, after reporting it.
    fatal: bool = False


class ResultNotJSON(Exception):
    """The handler returned something the queue cannot store as its result."""


ERROR_CHARS = 2_000
TRACEBACK_CHARS = 50_000


def storable(text: str, limit: int) -> str:
    """Text PostgreSQL can store: no NUL, valid UTF-8 (no lone surrogates), at most `limit` characters."""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 20] + " ... (truncated)"


def failed(
    reservation_id: int,
    error: str,
    *,
    tb: str = "",
    retryable: bool = True,
    timed_out: bool = False,
    fatal: bool = False,
    retry_in: float | None = None,
) -> Outcome:
    return Outcome(
        reservation_id,
        "failed",
        error=storable(error, ERROR_CHARS),
        traceback=storable(tb, TRACEBACK_CHARS),
        retryable=retryable,
        timed_out=timed_out,
        fatal=fatal,
        retry_in=retry_in,
    )


def own_retry_in(exc: BaseException) -> float | None:
    """The delay an exception asks for before the next attempt (`exc.retry_in`), when it is a sane number."""
    value = getattr(exc, "retry_in", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        return None
    return float(value)


def _check_result(result: Any) -> None:
    if result is None:  # most handlers return nothing: stored as SQL NULL, nothing to check (1.4 us an item)
        return
    try:
        encode_json(result, "result")
    except InvalidEnqueue as exc:
        raise ResultNotJSON(f"the handler's result cannot be stored: {exc}") from None


_thread = threading.local()


def _close_old_connections() -> None:
    """django.db.close_old_connections for this thread, without walking Django's connection handler each time.

    The handler keeps each thread's connection wrappers in asgiref's Local: two look-ups an alias on every walk,
    more than half the cost of the check itself (4.4 of a no-op item's ~29 us of the worker's CPU went to it).
    A pool thread or child takes its wrappers, one for every configured alias (making one opens nothing), the
    first time, then checks those; a wrapper stays the same object for the life of its thread."""
    try:
        wrappers = _thread.connections
    except AttributeError:
        wrappers = _thread.connections = connections.all()
    for wrapper in wrappers:
        wrapper.close_if_unusable_or_obsolete()


def _run_transactional(task: Task, payload: Any, ctx: Context, job: Job) -> Outcome:
    try:
        with atomic():
            if not engine.lock_reserved(ctx):
                return Outcome(ctx.reservation_id, "stale")
            with attempt_context(ctx, job.workflow_id, job.step):  # the handler's log lines carry its ids
                result = task.func(payload, ctx)
            _check_result(result)
            if task.produces:
                _record_produced(task, payload, result, ctx)
            engine.complete(ctx, result)
    except StaleReservation:
        return Outcome(ctx.reservation_id, "stale")
    return Outcome(ctx.reservation_id, "settled", result)


def _settled(reservation_id: int, settled: Settled) -> Outcome:
    """Status "settled": the handler's own settle; a failure's `error`, `retryable` False for a dead letter."""
    if settled.fate == "done":
        return Outcome(reservation_id, "settled", settled.result)
    return Outcome(
        reservation_id,
        "settled",
        settled.result,
        error=storable(settled.error or "failed", ERROR_CHARS),
        retryable=settled.fate != "dead",
        retry_in=settled.retry_in,
    )


def _record_produced(task: Task, payload: Any, result: Any, ctx: Context) -> None:
    """A producer task's success, inside its settle's transaction: the layers registered on the hook (the
    datasets app records the materializations) see it; without one, `produces=` changes nothing."""
    for hook in hooks.producer_succeeded:
        hook(task, payload, result, ctx.item_id)


# A chunk's member as a Job carries it (Job.payload of a chunk: one of these per item, the first the Job's own).
class Member(NamedTuple):
    reservation_id: int
    item_id: int
    payload: Any
    attempt: int
    max_attempts: int


def _member_outcome(member: Member, value: Any) -> Outcome:
    """One item's outcome from what a chunk handler returned for it."""
    if isinstance(value, ItemRetry):
        return failed(member.reservation_id, str(value.error))
    if isinstance(value, ItemDead):
        return failed(member.reservation_id, str(value.error), retryable=False)
    try:
        _check_result(value)
    except ResultNotJSON as exc:
        return failed(member.reservation_id, f"{type(exc).__name__}: {exc}", retryable=False)
    return Outcome(member.reservation_id, "ok", value)


def _run_chunk(task: Task, job: Job) -> Outcome:
    """A chunked task's handler over its items: status "chunk", `result` one Outcome per item, in order."""
    members = [Member(*m) for m in job.payload]
    items = [
        ChunkItem(
            task.decode(m.payload) if task.decode else m.payload,
            Context(
                m.item_id,
                m.reservation_id,
                m.attempt,
                m.max_attempts,
                job.task,
                job.queue,
                task.delivery,
                job.worker_id,
            ),
        )
        for m in members
    ]
    with attempt_context(items[0].ctx, job.workflow_id, job.step):
        returned = task.func(items)
    if returned is None:
        returned = [None] * len(members)
    if not isinstance(returned, list | tuple) or len(returned) != len(members):
        count = len(returned) if isinstance(returned, list | tuple) else type(returned).__name__
        raise TypeError(f"a chunk handler returns one outcome per item: {len(members)} items, got {count}")
    return Outcome(job.reservation_id, "chunk", [_member_outcome(m, v) for m, v in zip(members, returned, strict=True)])


def run_job(job: Job) -> Outcome:
    """run_job under the attempt's span when there is one (tracing on); a not-sampled item's context is only
    carried (engine/tracing.py: attaching it would cost more than the no-op it runs)."""
    parent = job.trace_parent
    if parent is None:
        return _run_job(job)
    if not tracing.sampled(parent):
        token = tracing.carried.set(parent)
        try:
            return _run_job(job)
        finally:
            tracing.carried.reset(token)
    token = tracing.attach(parent)
    try:
        return _run_job(job)
    finally:
        tracing.detach(token)


def _run_job(job: Job) -> Outcome:
    """Run `job`'s handler under its delivery mode. Exceptions become a failed Outcome, and so do the other
    BaseExceptions (SystemExit, KeyboardInterrupt): recorded with their class and traceback like any failure
    (retried only when the task's Retry names them), marked `fatal` so that a child process exits after
    reporting it."""
    task: Task | None = None
    try:
        task = get_task(job.task)
        if task.chunk is not None:
            return _run_chunk(task, job)
        payload = task.decode(job.payload) if task.decode else job.payload
        ctx = Context(  # positional (item_id, reservation_id, ...): one per item, keywords cost more
            job.item_id,
            job.reservation_id,
            job.attempt,
            job.max_attempts,
            job.task,
            job.queue,
            task.delivery,
            job.worker_id,
        )
        if task.delivery is Delivery.TRANSACTIONAL:
            return _run_transactional(task, payload, ctx, job)
        with attempt_context(ctx, job.workflow_id, job.step):  # its log lines carry its ids (logcontext.py)
            result = task.func(payload, ctx)
        if type(result) is Settled:  # the handler settled its item with its work: nothing left to settle
            return _settled(job.reservation_id, result)
        _check_result(result)
        if task.produces:  # a producer of datasets (one attribute check for every other task)
            _record_produced(task, payload, result, ctx)
        return Outcome(job.reservation_id, "ok", result)
    except Exception as exc:
        return failed(
            job.reservation_id,
            f"{type(exc).__name__}: {exc}",
            tb=traceback.format_exc(),
            retryable=task is None or task.retry.should_retry(exc),
            retry_in=own_retry_in(exc),
        )
    except BaseException as exc:  # noqa: B036 — SystemExit, KeyboardInterrupt, GeneratorExit raised by a handler
        return failed(
            job.reservation_id,
            f"{type(exc).__name__}: {exc}",
            tb=traceback.format_exc(),
            retryable=task is not None and task.retry.should_retry(exc),
            fatal=True,
        )
    finally:
        # As Django does at the end of a request: drop a connection the handler broke or left in a transaction,
        # and have the next job's first query check it (CONN_HEALTH_CHECKS), so one dropped by a server restart
        # meanwhile is replaced. Once per job.
        _close_old_connections()
