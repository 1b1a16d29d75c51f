"""lease(): take up to n items for a worker, each with a new reservation (one attempt, one fencing token)."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from . import sql
from .db import cursor
from .payload import decode_json

ALL_QUEUES = ("*",)


@dataclass(frozen=True, slots=True)
class Lease:
    """What a worker holds while it works on an item. `reservation_id` is the fencing token every settle names."""

    reservation_id: int
    item_id: int
    queue: str
    task: str
    payload: Any
    attempt: int
    max_attempts: int
    lease_expires_at: datetime
    priority: int
    ordering_key: str | None
    run_at: datetime
    created_at: datetime

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


def _lease_rows(cur: Any, queues: list[str], n: int, worker_id: str, lease_timeout: float | None) -> list[Lease]:
    cur.execute(sql.LEASE, {"queues": queues, "n": n, "worker_id": worker_id, "lease_timeout": lease_timeout})
    rows = cur.fetchall()
    leases = [
        Lease(r[0], r[1], r[2], r[3], decode_json(r[4]), r[5], r[6], r[7], r[8], r[9], r[10], r[11]) for r in rows
    ]
    leases.sort(key=lambda lease: (-lease.priority, lease.item_id))
    return leases


def lease(
    queues: Sequence[str] | None,
    n: int,
    worker_id: str,
    lease_timeout: float | None = None,
    *,
    using: str = "default",
) -> list[Lease]:
    """Reserve up to `n` items from `queues` (None or ALL_QUEUES: every queue) for `worker_id`.

    Paused queues are skipped. A queue with a concurrency limit is leased under its row lock, so concurrent
    workers never exceed the limit together. The lease lasts `lease_timeout` seconds, else the item's own,
    else its queue's.
    """
    if n <= 0:
        return []
    all_queues = queues is None or tuple(queues) == ALL_QUEUES
    with cursor(using) as cur:
        cur.execute(sql.LEASABLE_QUEUES, {"all_queues": all_queues, "queues": list(queues or [])})
        leasable = cur.fetchall()
        unlimited = [name for name, limit in leasable if limit is None]
        leases = _lease_rows(cur, unlimited, n, worker_id, lease_timeout) if unlimited else []
        for name, _ in ((name, limit) for name, limit in leasable if limit is not None):
            if len(leases) >= n:
                break
            with transaction.atomic(using=using):
                cur.execute(sql.LOCK_LIMITED_QUEUE, {"queue": name})
                locked = cur.fetchone()
                if locked is None or locked[0] is None:  # paused or unlimited since we looked
                    continue
                cur.execute(sql.IN_FLIGHT, {"queue": name})
                room = min(n - len(leases), locked[0] - cur.fetchone()[0])
                if room > 0:
                    leases += _lease_rows(cur, [name], room, worker_id, lease_timeout)
    return leases
