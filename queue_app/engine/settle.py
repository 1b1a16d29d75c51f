"""Settling a reservation: complete, fail (retry or dead), dead, extend, release. All fenced by reservation id.

A settle whose reservation is no longer the item's current one changes nothing: the single forms raise
StaleReservation, the batch forms return the stale ones so a worker can log them and move on.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from . import sql
from .db import Int8Array, JsonbArray, cursor
from .errors import InvalidEnqueue, InvalidResult, StaleReservation
from .payload import encode_json
from .retry import backoff_seconds


class Held(Protocol):
    """Anything naming an item and the reservation that holds it (a Lease, or a stored Reservation)."""

    reservation_id: int
    item_id: int
    attempt: int


def _encoded(result: Any) -> str | None:
    """A result as stored (JSON text, or None); InvalidResult when it is not JSON."""
    try:
        return None if result is None else encode_json(result, "result")
    except InvalidEnqueue as exc:
        raise InvalidResult(str(exc)) from None


def complete_many(done: Iterable[tuple[Held, Any]], *, using: str | None = None) -> list[Held]:
    """Mark items done with their results in one statement. Returns the leases that were stale (unchanged).
    Results must be JSON (InvalidResult otherwise, raised before anything is written)."""
    pairs = list(done)
    if not pairs:
        return []
    results = [_encoded(result) for _, result in pairs]
    with cursor(using) as cur:
        cur.execute(
            sql.COMPLETE_MANY,
            {
                "item_ids": Int8Array([h.item_id for h, _ in pairs]),
                "reservation_ids": Int8Array([h.reservation_id for h, _ in pairs]),
                "results": JsonbArray(results),
            },
        )
        settled = {row[0] for row in cur.fetchall()}
    return [h for h, _ in pairs if h.reservation_id not in settled]


def complete(held: Held, result: Any = None, *, using: str | None = None) -> None:
    """complete_many of one item, in a statement of its own (sql.COMPLETE_ONE: planned once per connection)."""
    encoded = _encoded(result)
    with cursor(using) as cur:
        cur.execute(
            sql.COMPLETE_ONE, {"item_id": held.item_id, "reservation_id": held.reservation_id, "result": encoded}
        )
        if cur.fetchone() is None:
            raise StaleReservation(held.reservation_id, held.item_id, "complete")


def _storable(text: str) -> str:
    """Handler-supplied text (error, traceback) as PostgreSQL text can hold it: a NUL character is written as
    the four characters \\x00 and a lone surrogate as "?", instead of the settle failing and the item staying
    reserved until its lease expires."""
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")


def _fail(
    held: Held,
    *,
    error: str,
    traceback: str,
    retry_in: float,
    force_dead: bool,
    reason: str,
    outcome: str | None,
    action: str,
    using: str,
) -> str:
    with cursor(using) as cur:
        cur.execute(
            sql.FAIL,
            {
                "item_id": held.item_id,
                "reservation_id": held.reservation_id,
                "error": _storable(error),
                "traceback": _storable(traceback),
                "retry_in": float(retry_in),
                "force_dead": force_dead,
                "reason": _storable(reason)[:200],
                "outcome": outcome,
            },
        )
        row = cur.fetchone()
    if row is None:
        raise StaleReservation(held.reservation_id, held.item_id, action)
    return "dead" if row[1] else "retry"


def fail(
    held: Held,
    error: str,
    *,
    traceback: str = "",
    retry_in: float | None = None,
    timed_out: bool = False,
    using: str | None = None,
) -> str:
    """Record a failed attempt. With attempts left the item goes back to ready after `retry_in` seconds
    (default: exponential backoff with jitter); otherwise it becomes a dead letter. Returns "retry" or "dead"."""
    return _fail(
        held,
        error=error,
        traceback=traceback,
        retry_in=backoff_seconds(held.attempt) if retry_in is None else max(0.0, retry_in),
        force_dead=False,
        reason="",
        outcome="timed_out" if timed_out else None,
        action="fail",
        using=using,
    )


def dead(
    held: Held,
    reason: str,
    error: str = "",
    *,
    traceback: str = "",
    timed_out: bool = False,
    using: str | None = None,
) -> None:
    """Send the item straight to the dead letters (poison: unknown task, undecodable payload; a failed
    at-most-once run), whatever its attempts."""
    _fail(
        held,
        error=error or reason,
        traceback=traceback,
        retry_in=0,
        force_dead=True,
        reason=reason[:200],
        outcome="timed_out" if timed_out else None,
        action="dead-letter",
        using=using,
    )


def start_at_most_once(held: Sequence[Held], *, using: str | None = None) -> list[Held]:
    """Record durably that the at-most-once handlers of `held` start now (sql.START_AT_MOST_ONCE): from here on
    none is delivered again, and one whose lease lapses becomes a dead letter saying its worker stopped mid-run.
    Returns the stale ones (no longer current, or past their lease deadline): their handlers must not run.
    Commits before returning when called outside a transaction, and durably (synchronous commit)."""
    if not held:
        return []
    with cursor(using) as cur:
        cur.execute(
            sql.START_AT_MOST_ONCE,
            {"item_ids": [h.item_id for h in held], "reservation_ids": [h.reservation_id for h in held]},
        )
        started = {row[0] for row in cur.fetchall()}
    return [h for h in held if h.reservation_id not in started]


def extend_many(held: Sequence[Held], seconds: float, *, using: str | None = None) -> dict[int, datetime]:
    """Push the lease deadline of each current reservation to now + seconds (heartbeat). Returns
    {reservation_id: new deadline} for those still current; a missing id means that reservation is stale."""
    if not held:
        return {}
    with cursor(using) as cur:
        cur.execute(
            sql.EXTEND_MANY,
            {
                "item_ids": [h.item_id for h in held],
                "reservation_ids": [h.reservation_id for h in held],
                "seconds": float(seconds),
            },
        )
        return dict(cur.fetchall())


def extend(held: Held, seconds: float, *, using: str | None = None) -> datetime:
    """extend_many of one item, in a statement of its own (sql.EXTEND_ONE: planned once per connection)."""
    with cursor(using) as cur:
        cur.execute(
            sql.EXTEND_ONE,
            {"item_id": held.item_id, "reservation_id": held.reservation_id, "seconds": float(seconds)},
        )
        row = cur.fetchone()
    if row is None:
        raise StaleReservation(held.reservation_id, held.item_id, "extend")
    return row[1]


def release(held: Held, *, delay: float = 0.0, using: str | None = None) -> None:
    """Hand the item back to the queue without spending the attempt (the handler never ran)."""
    with cursor(using) as cur:
        cur.execute(
            sql.RELEASE, {"item_id": held.item_id, "reservation_id": held.reservation_id, "delay": float(delay)}
        )
        if cur.fetchone() is None:
            raise StaleReservation(held.reservation_id, held.item_id, "release")
