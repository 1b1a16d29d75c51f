"""Settling what the handlers report, for the supervisor (worker/supervisor.py runs the loop and calls these): an
outcome becomes a complete (batched), a retry at the task's backoff, a dead letter, a release, or nothing
(stale). The Settler owns what waits for the database (completes in `done`, other settles in `pending`), when the
retries it sent back come due, and the worker's counters (Stats); it tells the supervisor when a settle may have
let another item go (`unblocked`: an ordering key, a dead item's key).

Delivery modes, here:
- at-least-once and transactional failures: retried by the task's Retry policy, then a dead letter.
- at-most-once: never retried: any failure is a dead letter (AMO_FAILED).
"""

import heapq
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db.utils import DatabaseError

from .. import engine
from ..engine import Lease, StaleReservation, tracing
from ..logcontext import attempt_ids
from ..registry import Delivery, Task
from .execute import Outcome
from .options import DATABASE_DOWN, Pending, Running
from .status import Stats, fields

logger = logging.getLogger("jobsite.worker")
AMO_FAILED = "at-most-once attempt failed (not retried)"


class Settler:
    """`unblocked(queues)` is called with the queues of settled items that had an ordering key."""

    def __init__(self, unblocked: Callable[[set[str]], None]) -> None:
        self.unblocked = unblocked
        self.stats = Stats()
        self.done: list[tuple[Lease, Any]] = []  # handler returned: complete_many these
        self.pending: list[Pending] = []
        self.due: list[float] = []  # heap: when items this worker sent back for a retry become due
        # With tracing on: the consumer span of each attempt in flight, by reservation id, ended here with its
        # outcome (engine/tracing.py). Empty with tracing off: each outcome checks an empty dict.
        self.spans: dict[int, Any] = {}

    def _end_span(self, lease: Lease, outcome: str, error: str = "", event: str | None = None, **fields: Any) -> None:
        span = self.spans.pop(lease.reservation_id, None)
        if span is not None:
            tracing.end_attempt(span, outcome, error=error, event=event, **fields)

    def unsettled(self) -> int:
        return len(self.done) + len(self.pending)

    # -- outcomes -------------------------------------------------------------------------------------------

    def finish(self, running: Running, outcome: Outcome) -> None:
        """What the pool reported for an item the supervisor has just taken out of its running ones. A chunk's
        items are settled each on its own: by the outcome its handler returned for it, or all by the chunk's
        failure when the handler raised."""
        if running.members:
            outcomes = outcome.result if outcome.status == "chunk" else [outcome] * len(running.members)
            for lease, own in zip(running.members, outcomes, strict=True):
                self.finish(Running(lease, running.task), own)
            return
        lease, task = running.lease, running.task
        if outcome.status == "ok":
            self.done.append((lease, outcome.result))
            if self.spans:
                self._end_span(lease, "done")
        elif outcome.status == "settled":  # by the handler, with its work: counted here, nothing to settle
            if outcome.error:
                self.settled_failed(lease, outcome)
                return
            self.stats.processed += 1
            if self.spans:
                self._end_span(lease, "done")
            self._unblocked([lease])
        elif outcome.status == "stale":
            self.stale(lease, "its transaction found the reservation no longer current; nothing was kept")
        else:
            self.failed(
                lease, task, outcome.error, outcome.traceback, outcome.retryable, outcome.timed_out, outcome.retry_in
            )

    def settled_failed(self, lease: Lease, outcome: Outcome) -> None:
        """A failure its handler settled itself (registry.Settled): a retry when `retryable`, else dead."""
        self.stats.failed += 1
        logger.info(
            "attempt failed %s",
            fields(item=lease.item_id, task=lease.task, attempt=lease.attempt, error=repr(outcome.error[:200])),
            extra=attempt_ids(lease),
        )
        if not outcome.retryable:
            self.stats.dead += 1
            if self.spans:
                self._end_span(lease, "failed", outcome.error, "dead_letter", error=outcome.error[:500])
            self._unblocked([lease])
            return
        if outcome.retry_in is not None:
            heapq.heappush(self.due, time.monotonic() + outcome.retry_in)
        if self.spans:
            self._end_span(
                lease, "failed", outcome.error, "retry", retry_in_s=outcome.retry_in, next_attempt=lease.attempt + 1
            )

    def stale(self, lease: Lease, why: str) -> None:
        self.stats.stale += 1
        if self.spans:
            self._end_span(lease, "stale", event="stale", why=why)
        logger.info(
            "stale %s",
            fields(item=lease.item_id, reservation=lease.reservation_id, why=repr(why)),
            extra=attempt_ids(lease),
        )

    def failed(
        self,
        lease: Lease,
        task: Task,
        error: str,
        tb: str,
        retryable: bool,
        timed_out: bool = False,
        retry_in: float | None = None,
    ) -> None:
        self.stats.failed += 1
        self.stats.timed_out += timed_out
        logger.info(
            "attempt failed %s",
            fields(item=lease.item_id, task=lease.task, attempt=lease.attempt, error=repr(error[:200])),
            extra=attempt_ids(lease),
        )
        if self.spans:
            self._end_failed_span(lease, task, error, retryable, timed_out, retry_in)
        if task.delivery is Delivery.AT_MOST_ONCE:
            self._later(
                lease,
                "dead letter (at-most-once)",
                lambda: self._dead(lease, AMO_FAILED, error, tb, timed_out=timed_out),
            )
        elif not retryable:
            reason = f"not retryable: {error}"
            self._later(lease, "dead letter", lambda: self._dead(lease, reason, error, tb))
        elif task.retry.times is not None and task.retry.times <= lease.attempt < lease.max_attempts:
            # The task allows fewer attempts than the item was enqueued with (not through the task).
            self._later(lease, "dead letter", lambda: self._dead(lease, "max attempts exhausted", error, tb))
        else:
            retry_in = task.retry.retry_in(lease.attempt) if retry_in is None else retry_in
            self.pending.append(
                Pending(
                    lease,
                    "fail",
                    lambda: engine.fail(lease, error, traceback=tb, retry_in=retry_in, timed_out=timed_out),
                    retry_in,
                )
            )

    def _end_failed_span(
        self, lease: Lease, task: Task, error: str, retryable: bool, timed_out: bool, retry_in: float | None
    ) -> None:
        """The attempt's span: failed (or timed out), with what follows as an event: a dead letter or a retry."""
        outcome = "timed_out" if timed_out else "failed"
        dead = (
            task.delivery is Delivery.AT_MOST_ONCE
            or not retryable
            or (task.retry.times is not None and task.retry.times <= lease.attempt < lease.max_attempts)
            or lease.attempt >= lease.max_attempts
        )
        if dead:
            self._end_span(lease, outcome, error, "dead_letter", error=error[:500])
        else:
            retry_in = task.retry.retry_in(lease.attempt) if retry_in is None else retry_in
            self._end_span(lease, outcome, error, "retry", retry_in_s=retry_in, next_attempt=lease.attempt + 1)

    def abandoned(self, lease: Lease, timed_out: bool) -> None:
        """A transactional handler's thread overran and was left to its transaction (it settles the item, or
        rolls back and the lease expires): nothing to settle from here."""
        logger.warning("abandoned %s", fields(item=lease.item_id, task=lease.task, why="transactional thread overran"))
        if self.spans:
            self._end_span(lease, "abandoned")
        self.stats.timed_out += timed_out

    def poison(self, lease: Lease, reason: str) -> None:
        logger.warning(
            "poison %s", fields(item=lease.item_id, task=lease.task, reason=repr(reason)), extra=attempt_ids(lease)
        )
        self._later(lease, "dead letter (poison)", lambda: self._dead(lease, reason[:200], reason))

    def release(self, lease: Lease) -> None:
        """Hand the item back unspent (its attempt not counted), when the database allows."""
        if self.spans:
            self._end_span(lease, "released", event="released")

        def release() -> str:
            engine.release(lease)
            return "released"

        self._later(lease, "release", release)

    @staticmethod
    def _dead(lease: Lease, reason: str, error: str = "", tb: str = "", *, timed_out: bool = False) -> str:
        engine.dead(lease, reason, error, traceback=tb, timed_out=timed_out)
        return "dead"

    def _later(self, lease: Lease, what: str, apply: Callable[[], str]) -> None:
        self.pending.append(Pending(lease, what, apply))

    # -- settles --------------------------------------------------------------------------------------------

    def take_done(self) -> list[tuple[Lease, Any]]:
        """The completes waiting, handed to a settle-and-lease call; given back if it fails (give_back)."""
        sent, self.done = self.done, []
        return sent

    def give_back(self, sent: list[tuple[Lease, Any]]) -> None:
        self.done[:0] = sent  # settled again later: completes are fenced

    def completed(self, stale: list[Lease], settled: list[tuple[Lease, Any]]) -> None:
        """`settled`, the (lease, result) pairs a complete wrote, of which `stale` were no longer current."""
        self.stats.processed += len(settled) - len(stale)
        for lease in stale:
            self.stale(lease, "complete found the reservation no longer current")
        self._unblocked(lease for lease, _ in settled)

    def complete_done(self) -> None:
        if self.done:
            stale = engine.complete_many(self.done)
            self.completed(stale, self.take_done())

    def settle_pending(self) -> None:
        while self.pending:
            settle = self.pending[0]
            try:
                fate = settle.apply()
            except StaleReservation:
                fate = "stale"
            except DATABASE_DOWN:
                raise
            except DatabaseError:  # the server refused this one settle: log it, never spin on it
                logger.exception(
                    "settle refused %s",
                    fields(item=settle.lease.item_id, what=repr(settle.what)),
                    extra=attempt_ids(settle.lease),
                )
                fate = "refused"
            self.pending.pop(0)
            if fate == "retry" and settle.retry_in is not None:
                heapq.heappush(self.due, time.monotonic() + settle.retry_in)
            if fate == "dead":
                self.stats.dead += 1
                self._unblocked([settle.lease])
            elif fate == "stale":
                self.stale(settle.lease, f"{settle.what} found the reservation no longer current")

    def _unblocked(self, settled: Iterable[Lease]) -> None:
        queues = {lease.queue for lease in settled if lease.ordering_key is not None}
        if queues:
            self.unblocked(queues)

    # -- retries coming due ---------------------------------------------------------------------------------

    def next_due(self) -> float:
        """When the first retry this worker sent back becomes due (inf: none)."""
        return self.due[0] if self.due else float("inf")

    def forget_due(self, now: float) -> None:
        """A lease went out now: it takes what had come due."""
        while self.due and self.due[0] <= now:
            heapq.heappop(self.due)
