"""Reservation as a lock, for any Django code: take the next item of a queue, hold it while a block runs, settle
it when the block ends. The engine's lease, extend and settle (and their fencing) behind a context manager.

    from queue_app.reservations import reserve

    held = reserve("exports", timeout=10)        # the next item, waiting up to 10 s; None when none came
    if held is not None:
        with held:                               # its lease is extended while the block runs
            held.result = build_export(held.payload)
        # done on success; on an exception: retried after a backoff (attempts left) or a dead letter, and the
        # exception goes on. A lease that lapsed meanwhile raises LeaseLost: nothing was settled.

Items are queued as usual (`engine.enqueue("exports.build", {...}, queue="exports")`). Use a queue that no
`run_worker` serves (`run_worker --queues` without it), or a worker will take its items too. A holder is
`worker_id` "lock:<host>:<pid>" in the attempt history unless `holder` names it.
"""

import contextlib
import math
import os
import socket
import threading
import time
import traceback
from datetime import datetime
from types import TracebackType
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql as psql

from . import engine
from .conf import queue_settings
from .engine.alias import queue_db
from .engine.enqueue import QUEUE_NAME
from .engine.errors import QueueError, StaleReservation
from .models import Queue
from .registry import Settled

__all__ = ["HeldItem", "InvalidReservation", "LeaseLost", "UnknownQueue", "reserve"]

# Between two lease attempts while waiting, at most this long (a NOTIFY usually wakes the wait sooner).
RECHECK = 0.5


class InvalidReservation(QueueError, ValueError):
    """reserve() was given arguments it cannot act on; nothing was written."""


class UnknownQueue(QueueError, LookupError):
    """reserve() named a queue that does not exist; nothing was written."""


class LeaseLost(StaleReservation):
    """The lease lapsed (or the item was cancelled or taken over) while the block held it: nothing was settled,
    and the item may be running elsewhere. The block's work, if it had effects, may be done twice."""

    def __init__(self, held: "HeldItem", when: str) -> None:
        StaleReservation.__init__(self, held.reservation_id, held.item_id, "settle")
        self.args = (
            f"item {held.item_id}: the lease of reservation {held.reservation_id} was lost {when} (it lapsed, "
            "or the item was cancelled or taken by another holder); nothing was settled",
        )


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidReservation(f"{name} must be a number of seconds > 0, not {value!r}")
    return float(value)


class HeldItem:
    """One reserved item. Use it as a context manager (once): the lease is extended every `lease`/3 seconds
    while the block runs, and the item is settled on exit. Set `result` (JSON) inside the block to store it; a
    registry.Settled result (a task handler run here that settled the item itself) is settled already."""

    def __init__(self, lease: engine.Lease, lease_seconds: float, using: str) -> None:
        self._lease = lease
        self.item_id = lease.item_id
        self.reservation_id = lease.reservation_id
        self.attempt = lease.attempt
        self.max_attempts = lease.max_attempts
        self.queue = lease.queue
        self.task = lease.task
        self.payload = lease.payload
        self.lease_expires_at: datetime = lease.lease_expires_at
        self.lease_seconds = lease_seconds
        self.result: Any = None
        self.outcome: str | None = None  # "done", "retry" or "dead" once settled
        self._using = using
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None
        self._entered = False

    def __repr__(self) -> str:
        return f"<HeldItem item={self.item_id} reservation={self.reservation_id} queue={self.queue!r}>"

    @property
    def lost(self) -> bool:
        """The heartbeat found the lease no longer ours (the block should stop early)."""
        return self._lost.is_set()

    def _heartbeat(self) -> None:
        try:
            while not self._stop.wait(self.lease_seconds / 3):
                try:
                    self.lease_expires_at = engine.extend(self._lease, self.lease_seconds, using=self._using)
                except StaleReservation:
                    self._lost.set()
                    return
                except psycopg.Error:  # the server is away: try again at the next beat, the lease may still hold
                    connections[queue_db(self._using)].close()
        finally:
            connections[queue_db(self._using)].close()  # this thread's own connection

    def __enter__(self) -> "HeldItem":
        if self._entered:
            raise RuntimeError("a HeldItem is entered once: reserve() again for another item")
        self._entered = True
        try:
            self.lease_expires_at = engine.extend(self._lease, self.lease_seconds, using=self._using)
        except StaleReservation:
            raise LeaseLost(self, "before the block started") from None
        self._thread = threading.Thread(target=self._heartbeat, name=f"jobsite-hold-{self.item_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if exc is None and isinstance(self.result, Settled):  # a task handler that settled its item itself
                self.outcome = self.result.fate
            elif exc is None:
                engine.complete(self._lease, self.result, using=self._using)
                self.outcome = "done"
            else:
                error = f"{type(exc).__name__}: {exc}"
                text = "".join(traceback.format_exception(kind, exc, tb))
                self.outcome = engine.fail(self._lease, error, traceback=text, using=self._using)
        except StaleReservation:
            raise LeaseLost(self, "while the block ran") from exc
        return False  # an exception of the block goes on


def _holder(holder: str | None) -> str:
    if holder is None:
        return f"lock:{socket.gethostname()}:{os.getpid()}"
    if not isinstance(holder, str) or not 0 < len(holder) <= 200 or "\x00" in holder:
        raise InvalidReservation(f"holder must be a name of 1 to 200 characters, not {holder!r}")
    return holder


def reserve(
    queue: str,
    *,
    timeout: float = 5.0,
    lease: float = 30.0,
    holder: str | None = None,
    using: str | None = None,
) -> HeldItem | None:
    """Reserve the next item of `queue` (priority, then due time, then id; FIFO per ordering key, as a worker
    would), waiting up to `timeout` seconds for one (a NOTIFY from an enqueue wakes the wait). Returns a
    HeldItem to use as a context manager, or None when no item came in time. Its lease lasts `lease` seconds
    and is extended while the block runs.

    Raises InvalidReservation (timeout or lease not > 0, a bad holder name) or UnknownQueue, writing nothing.
    """
    timeout = _seconds("timeout", timeout)
    lease = _seconds("lease", lease)
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise InvalidReservation(f"queue name must match {QUEUE_NAME.pattern}, not {queue!r}")
    holder = _holder(holder)
    if not Queue.objects.using(queue_db(using)).filter(name=queue).exists():
        raise UnknownQueue(f"no queue named {queue!r} (a queue exists once something was enqueued to it)")
    deadline = time.monotonic() + timeout
    listener: psycopg.Connection | None = None
    try:
        while True:
            leases = engine.lease([queue], 1, holder, lease, using=using)
            if leases:
                return HeldItem(leases[0], lease, using)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if listener is None:
                listener = _listen(using)
                continue  # an enqueue may have committed before LISTEN did: look once more first
            _wait(listener, queue, min(left, RECHECK))
    finally:
        if listener is not None:
            with contextlib.suppress(psycopg.Error):
                listener.close()


def _listen(using: str) -> psycopg.Connection | None:
    try:
        conn = engine.dedicated_connection(using=using)
        conn.execute(psql.SQL("LISTEN {}").format(psql.Identifier(queue_settings.NOTIFY_CHANNEL)))
    except psycopg.Error:
        return None  # polling every RECHECK seconds still works
    return conn


def _wait(listener: psycopg.Connection | None, queue: str, seconds: float) -> None:
    if listener is None:
        time.sleep(seconds)
        return
    try:
        for note in listener.notifies(timeout=seconds):
            if note.payload == queue:
                return
    except psycopg.Error:
        time.sleep(seconds)
