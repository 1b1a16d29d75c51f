"""Maintenance duties of the engine, each one statement: rescue expired leases, prune done items and
expired dedup claims. The worker runs them on their own intervals under an advisory lock."""

from ..conf import queue_settings
from . import sql
from .db import cursor


def rescue_expired(limit: int = 1000, *, lost_after: float | None = None, using: str = "default") -> tuple[int, int]:
    """Expired leases, and leases of workers silent for `lost_after` seconds (default WORKER_LOST_AFTER), go
    back to ready (attempt counted) or, on their last attempt, to the dead letters. Returns (rescued, dead)."""
    if lost_after is None:
        lost_after = queue_settings.WORKER_LOST_AFTER
    with cursor(using) as cur:
        cur.execute(sql.RESCUE_EXPIRED, {"limit": limit, "lost_after": float(lost_after)})
        rescued, died = cur.fetchone()
    return rescued, died


def prune_done(limit: int = 10_000, *, using: str = "default") -> int:
    """Delete done items older than their queue's retention (their reservations go with them)."""
    with cursor(using) as cur:
        cur.execute(sql.PRUNE_DONE, {"limit": limit})
        return cur.rowcount


def prune_dedup_claims(*, using: str = "default") -> int:
    with cursor(using) as cur:
        cur.execute(sql.PRUNE_DEDUP)
        return cur.rowcount
