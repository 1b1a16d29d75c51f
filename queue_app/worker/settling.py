"""Settling what the handlers report, for the supervisor (worker/supervisor.py runs the loop and calls these):
an outcome becomes a complete (batched), a retry at the task's backoff, a dead letter, or nothing (stale); a
handler past its hard timeout is stopped; what was settled may wake the next lease (a retry's due time, an
ordering key unblocked). A mixin: the state it reads and writes is the supervisor's.

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
from ..engine import Lease, StaleReservation
from ..logcontext import attempt_ids
from ..registry import Delivery, Task
from .execute import Outcome
from .options import DATABASE_DOWN, DEADLINE_RECHECK, Pending
from .status import fields

logger = logging.getLogger("jobsite.worker")
AMO_FAILED = "at-most-once attempt failed (not retried)"


class Settling:
    """The supervisor's outcome and settle steps (a mixin of Supervisor)."""

    # -- outcomes -------------------------------------------------------------------------------------------

    def _finish(self, outcome: Outcome) -> None:
        running = self.running.pop(outcome.reservation_id, None)
        if running is None:  # already stopped (hard timeout, stale) and accounted for
            return
        self._slot_freed()
        lease, task = running.lease, running.task
        if outcome.status == "ok":
            self.done.append((lease, outcome.result))
        elif outcome.status == "settled":
            self.stats.processed += 1
        elif outcome.status == "stale":
            self._stale(lease, "its transaction found the reservation no longer current; nothing was kept")
        else:
            self._failed(
                lease, task, outcome.error, outcome.traceback, outcome.retryable, outcome.timed_out, outcome.retry_in
            )

    def _stale(self, lease: Lease, why: str) -> None:
        self.stats.stale += 1
        logger.info(
            "stale %s",
            fields(item=lease.item_id, reservation=lease.reservation_id, why=repr(why)),
            extra=attempt_ids(lease),
        )

    def _failed(
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
        if task.delivery is Delivery.AT_MOST_ONCE:
            self._settle_later(
                lease,
                "dead letter (at-most-once)",
                lambda: self._dead(lease, AMO_FAILED, error, tb, timed_out=timed_out),
            )
        elif not retryable:
            reason = f"not retryable: {error}"
            self._settle_later(lease, "dead letter", lambda: self._dead(lease, reason, error, tb))
        elif task.retry.times is not None and task.retry.times <= lease.attempt < lease.max_attempts:
            # The task allows fewer attempts than the item was enqueued with (not through the task).
            self._settle_later(lease, "dead letter", lambda: self._dead(lease, "max attempts exhausted", error, tb))
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

    @staticmethod
    def _dead(lease: Lease, reason: str, error: str = "", tb: str = "", *, timed_out: bool = False) -> str:
        engine.dead(lease, reason, error, traceback=tb, timed_out=timed_out)
        return "dead"

    def _settle_later(self, lease: Lease, what: str, apply: Callable[[], str]) -> None:
        self.pending.append(Pending(lease, what, apply))

    def _poison(self, lease: Lease, reason: str) -> None:
        logger.warning(
            "poison %s", fields(item=lease.item_id, task=lease.task, reason=repr(reason)), extra=attempt_ids(lease)
        )
        self._settle_later(lease, "dead letter (poison)", lambda: self._dead(lease, reason[:200], reason))

    def _enforce_deadlines(self) -> None:
        """Stop handlers past their hard timeout (counted from when the pool started them), and everything at
        the end of the grace period. Walks what is in flight only when the earliest deadline may have come."""
        now = time.monotonic()
        out_of_grace = self.stopping and now >= self.grace_deadline
        if now < self.next_deadline and not out_of_grace:
            return  # the common case, without a walk over everything in flight
        self.next_deadline = float("inf")
        for reservation_id, running in list(self.running.items()):
            started = self.pool.started_at(reservation_id)
            if started is None:  # waiting in the pool's queue: its clock has not started; look again soon
                self.next_deadline = min(self.next_deadline, now + DEADLINE_RECHECK)
                deadline = float("inf")
            else:
                deadline = started + running.task.hard_timeout
            if now < deadline and not out_of_grace:
                self.next_deadline = min(self.next_deadline, deadline)
                continue
            self.pool.stop(reservation_id)
            del self.running[reservation_id]
            self._slot_freed()
            lease, task = running.lease, running.task
            if self.pool.kind == "thread" and task.delivery is Delivery.TRANSACTIONAL:
                # An abandoned thread keeps its transaction and the item's row lock: a settle from here would
                # wait on that lock. Its transaction settles the item, or rolls back (at the latest when the
                # process is replaced); then the lease expires.
                logger.warning(
                    "abandoned %s", fields(item=lease.item_id, task=lease.task, why="transactional thread overran")
                )
                self.stats.timed_out += now >= deadline
            elif now >= deadline:
                how = "its child process was killed" if self.pool.kind == "process" else "its thread was abandoned"
                error = f"hard timeout: the handler ran longer than {task.hard_timeout:g}s and was stopped ({how})"
                logger.warning(
                    "timed out %s",
                    fields(item=lease.item_id, task=lease.task, attempt=lease.attempt),
                    extra=attempt_ids(lease),
                )
                self._failed(lease, task, error, "", retryable=True, timed_out=True)
            elif task.delivery is Delivery.AT_MOST_ONCE:
                self._failed(lease, task, "the worker shut down before the handler finished", "", retryable=False)
            else:
                self._release_later(lease)
            if self.pool.kind == "thread" and now >= deadline:
                self._replace_when_settled()  # the abandoned thread runs on: only a new process ends it

    def _release_later(self, lease: Lease) -> None:
        def release() -> str:
            engine.release(lease)
            return "released"

        self._settle_later(lease, "release", release)

    def _completed(self, stale: list[Lease], settled: list[tuple[Lease, Any]]) -> None:
        """`settled`, the (lease, result) pairs a complete wrote, of which `stale` were no longer current."""
        self.stats.processed += len(settled) - len(stale)
        for lease in stale:
            self._stale(lease, "complete found the reservation no longer current")
        self._unblocked(lease for lease, _ in settled)

    def _unblocked(self, settled: Iterable[Lease]) -> None:
        """Settled items with an ordering key let the next item of their key go: lease again at once rather
        than at the next poll, and wake the other workers when this one has no room for it."""
        queues = {lease.queue for lease in settled if lease.ordering_key is not None}
        if not queues:
            return
        self.woken = True
        if self._free() == 0:
            engine.notify(queues)

    def _complete_done(self) -> None:
        if self.done:
            stale = engine.complete_many(self.done)
            settled, self.done = self.done, []
            self._completed(stale, settled)

    def _settle_pending(self) -> None:
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
                self._stale(settle.lease, f"{settle.what} found the reservation no longer current")
