"""The queue engine: enqueue, lease, settle, maintain. Plain SQL (engine/sql.py) on Django's connection.

from queue_app import engine
item = engine.enqueue("billing.charge", {"order": 42}, dedup_key="order-42")
for held in engine.lease(["default"], 10, worker_id="w1"):
    engine.complete(held, {"ok": True})
"""

from . import leaders, pooler
from .db import engine_session_here
from .enqueue import Enqueued, enqueue, enqueue_many, ensure_queue, is_task_name, notify, use_task_defaults
from .errors import CrossDatabaseEnqueue, InvalidEnqueue, QueueError, StaleReservation
from .history import (
    archive,
    drop_expired_partitions,
    ensure_partitions,
    prune_history,
    shortest_row_retention,
    within_lock_timeout,
)
from .lease import ALL_QUEUES, Lease, SettledAndLeased, Terms, lease, ready_exists, settle_and_lease
from .maintenance import (
    analyze,
    bloated_tables,
    prune_dedup_claims,
    prune_done,
    rescue_expired,
    stale_statistics,
    vacuum,
)
from .marks import take_mark
from .pruning import PRUNE_BATCH, history_round, prune_round, prune_rounds
from .retry import backoff_seconds
from .settle import complete, complete_many, dead, extend, extend_many, fail, release, start_at_most_once
from .workers import (
    LeaseTerms,
    WorkerRow,
    connection_room,
    dedicated_connection,
    listen_connection,
    lock_reserved,
    renew_leases,
    save_worker,
    sweep_workers,
    try_maintenance_lock,
)

__all__ = [
    "engine_session_here",
    "leaders",
    "pooler",
    "ALL_QUEUES",
    "PRUNE_BATCH",
    "Enqueued",
    "CrossDatabaseEnqueue",
    "InvalidEnqueue",
    "Lease",
    "LeaseTerms",
    "QueueError",
    "SettledAndLeased",
    "StaleReservation",
    "Terms",
    "WorkerRow",
    "analyze",
    "archive",
    "backoff_seconds",
    "bloated_tables",
    "complete",
    "complete_many",
    "connection_room",
    "dead",
    "dedicated_connection",
    "listen_connection",
    "drop_expired_partitions",
    "enqueue",
    "enqueue_many",
    "ensure_partitions",
    "ensure_queue",
    "extend",
    "extend_many",
    "fail",
    "history_round",
    "is_task_name",
    "lease",
    "lock_reserved",
    "notify",
    "prune_dedup_claims",
    "prune_done",
    "prune_round",
    "prune_rounds",
    "prune_history",
    "ready_exists",
    "release",
    "renew_leases",
    "rescue_expired",
    "save_worker",
    "settle_and_lease",
    "shortest_row_retention",
    "stale_statistics",
    "start_at_most_once",
    "sweep_workers",
    "take_mark",
    "try_maintenance_lock",
    "use_task_defaults",
    "vacuum",
    "within_lock_timeout",
]
