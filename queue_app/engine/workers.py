"""The engine's side of a worker: its Worker row (register, heartbeat, stop, sweep), lease renewal, the fenced
row lock of transactional delivery, and dedicated connections (LISTEN, logs that must survive a rollback).

The worker runtime (queue_app/worker/) calls these; like the rest of the engine they are plain SQL from sql.py.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import pooler, sql
from .alias import queue_connection
from .db import Int8Array, cursor
from .settle import Held

# Advisory-lock namespace of jobsite's maintenance units (first key of the two-key form).
MAINTENANCE_LOCK_NAMESPACE = 0x6A6F62  # "job"


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """What a worker says about itself in its Worker row."""

    worker_id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime


def save_worker(row: WorkerRow, state: str, stats: dict[str, Any], *, using: str | None = None) -> None:
    """Register the worker, or heartbeat it (last_heartbeat = now) with its state and stats."""
    with cursor(using) as cur:
        cur.execute(
            sql.UPSERT_WORKER,
            {
                "worker_id": row.worker_id,
                "host": row.host,
                "pid": row.pid,
                "queues": json.dumps(row.queues),
                "concurrency": row.concurrency,
                "started_at": row.started_at,
                "state": state,
                "stats": json.dumps(stats),
            },
        )


def connection_room(*, using: str | None = None) -> int:
    """How many more connections this database role may open on the server now (others may take them first)."""
    with cursor(using) as cur:
        cur.execute(sql.CONNECTION_ROOM)
        return int(cur.fetchone()[0])


def sweep_workers(lost_after: float, forget_after: float, *, using: str | None = None) -> tuple[int, int]:
    """Mark workers silent for `lost_after` seconds stopped and delete rows silent for `forget_after`.
    Returns (marked stopped, deleted)."""
    with cursor(using) as cur:
        cur.execute(sql.SWEEP_WORKERS, {"lost_after": float(lost_after), "forget_after": float(forget_after)})
        lost, gone = cur.fetchone()
    return lost, gone


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How long one held item's lease must be: its task's lease (None: the item's, else its queue's), and
    never less than `min_lease` (the task's hard timeout plus a margin)."""

    held: Held
    task_lease: float | None
    min_lease: float


def renew_leases(
    terms: Sequence[LeaseTerms], *, keep_longer: bool, tolerance: float = 0.0, using: str | None = None
) -> dict[int, datetime | None]:
    """Set each held item's lease to now + its terms (see sql.RENEW_LEASES). Returns {reservation_id: new
    deadline, or None when not rewritten (already right, or locked by its transactional handler)} for the
    reservations still current; a reservation missing from the result is stale (cancelled or taken again)."""
    if not terms:
        return {}
    with cursor(using) as cur:
        cur.execute(
            sql.RENEW_LEASES,
            {
                "item_ids": Int8Array([t.held.item_id for t in terms]),
                "reservation_ids": Int8Array([t.held.reservation_id for t in terms]),
                "task_leases": [t.task_lease for t in terms],
                "min_leases": [float(t.min_lease) for t in terms],
                "keep_longer": keep_longer,
                "tolerance": float(tolerance),
            },
        )
        return dict(cur.fetchall())


def lock_reserved(held: Held, *, using: str | None = None) -> bool:
    """Inside the caller's transaction, lock the item's row if `held` is still its current reservation.
    False means the reservation is stale and the handler must not run."""
    with cursor(using) as cur:
        cur.execute(sql.LOCK_RESERVED, {"item_id": held.item_id, "reservation_id": held.reservation_id})
        return cur.fetchone() is not None


def try_maintenance_lock(unit: str, *, using: str | None = None) -> bool:
    """Inside the caller's transaction, take the advisory lock of maintenance unit `unit` if no other worker
    holds it. Released at commit or rollback."""
    with cursor(using) as cur:
        cur.execute(sql.TRY_MAINTENANCE_LOCK, {"namespace": MAINTENANCE_LOCK_NAMESPACE, "unit": unit})
        return bool(cur.fetchone()[0])


def dedicated_connection(*, using: str | None = None) -> psycopg.Connection:
    """A new autocommit psycopg connection with Django's parameters for `using` (prepare_threshold None: nothing
    prepared), outside Django's connection handling: for writes that must not join (or roll back with) the
    current transaction, and for statements that cannot run in one (VACUUM)."""
    return psycopg.connect(**queue_connection(using).get_connection_params(), autocommit=True)


def listen_connection(*, using: str | None = None) -> psycopg.Connection:
    """The worker's LISTEN connection (autocommit): from LISTEN_DATABASE_URL, past a pooler, when it is set."""
    return pooler.listen_connection(queue_connection(using).get_connection_params())
