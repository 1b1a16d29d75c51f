"""Partitioned history: finished items and their reservations leave the hot tables for tables partitioned by day
(migration 0017), and retention drops whole days.

- The settle never moves a row (a DELETE + INSERT per settle would cost the hot path); `archive` moves, in batches,
  done and cancelled items finished more than a grace period ago, with their reservations, in one statement, ids
  kept. The grace keeps a just-finished item where a retried complete (its reply lost) finds it `already` done.
- Dead items stay in the hot table: their dead letters hold them by a foreign key (ON DELETE CASCADE), they wait
  for a person (requeue or purge) and are few; so does any item with a dead letter (one requeued and finished).
- `ensure_partitions` creates the coming days' partitions ahead; `archive` also creates any it needs on demand.
- `drop_expired_partitions`: a UTC day is dropped (DROP TABLE of both its partitions) once it ended more than the
  longest queue retention ago. A queue keeping less than the longest, or less than a day (a partition's span:
  its day would otherwise keep up to a day more than it asked, 1.9 GB an hour at 1,400 items/s), has its older
  archived rows deleted row by row (`prune_history`): honest and simple, and only such queues pay for it. The
  vacuum unit makes their space reusable (engine.bloated_tables looks at the history partitions too).
"""

import datetime as dt
import logging
from collections.abc import Callable

from django.db import DatabaseError
from psycopg import sql as psql

from ..conf import queue_settings
from . import sql
from .alias import atomic, queue_connection
from .db import cursor

PARTITIONS_AHEAD = 2  # days of partitions created ahead of today
PARTITION_SPAN = 86_400.0  # seconds a partition holds: a UTC day
DDL_LOCK_TIMEOUT = "2s"  # a partition's CREATE or DROP waits this long for readers, then gives up (next round)


logger = logging.getLogger("jobsite.worker")


def within_lock_timeout(step: Callable[[], int], what: str, *, using: str | None = None) -> int:
    """Run one history step with lock_timeout set: creating or dropping a partition needs the history's parent
    tables to itself for a moment, and waiting behind a long reader would queue every later reader and writer
    behind it. The parents are never held one while waiting for the other (a DDL that did could deadlock with a
    reader of both, migration 0041); a lock not granted in time leaves the step to the next round: 0 done, said
    in the log."""
    try:
        with atomic(using), queue_connection(using).cursor() as cur:
            cur.execute("SELECT set_config('lock_timeout', %s, true)", [DDL_LOCK_TIMEOUT])
            return step()
    except DatabaseError as exc:
        logger.info("maintenance %s deferred: %s", what, exc)
        return 0


def archive(limit: int = 10_000, *, grace: float | None = None, using: str | None = None) -> int:
    """Move up to `limit` finished items (done or cancelled, finished more than `grace` seconds ago, default
    ARCHIVE_AFTER, without a dead letter) and their reservations into the history tables. Returns how many items
    moved. Call inside a transaction: the pick locks the rows the move then takes."""
    if grace is None:
        grace = queue_settings.ARCHIVE_AFTER
    with cursor(using) as cur:
        cur.execute(sql.ARCHIVE_PICK, {"grace": float(grace), "limit": limit})
        picked = cur.fetchall()
        if not picked:
            return 0
        cur.execute(sql.ENSURE_PARTITIONS, {"days": sorted({day for _, day in picked})})
        cur.execute(sql.ARCHIVE_MOVE, {"ids": [item_id for item_id, _ in picked]})
        return cur.rowcount


def restore(item_ids: list[int], *, using: str | None = None) -> list[int]:
    """Archived dead or cancelled items back into the hot tables with their reservations (a requeue's first
    step). Returns the ids moved back."""
    if not item_ids:
        return []
    # Django's own cursor, not a prepared one: planned for these ids (an admin action, not the hot path), where
    # a generic plan may guess at the partitions' sizes.
    with queue_connection(using).cursor() as cur:
        cur.execute(sql.RESTORE_ITEMS, {"ids": list(item_ids)})
        return [row[0] for row in cur.fetchall()]


def ensure_partitions(
    days_ahead: int = PARTITIONS_AHEAD, *, today: dt.date | None = None, using: str | None = None
) -> int:
    """Create the partitions of today and the next `days_ahead` UTC days where missing; returns how many days."""
    today = today or dt.datetime.now(dt.UTC).date()
    days = [today + dt.timedelta(days=n) for n in range(days_ahead + 1)]
    with cursor(using) as cur:
        cur.execute(sql.ENSURE_PARTITIONS, {"days": days})
        return cur.fetchone()[0]


def partitions(*, using: str | None = None) -> list[tuple[str, dt.date]]:
    """(table, UTC day) of every history partition, oldest first."""
    with cursor(using) as cur:
        cur.execute(sql.HISTORY_PARTITIONS)
        return cur.fetchall()


def retentions(*, using: str | None = None) -> dict[str, float]:
    """Seconds each queue keeps its finished items."""
    with cursor(using) as cur:
        cur.execute(sql.RETENTIONS)
        return {name: float(seconds) for name, seconds in cur.fetchall()}


def drop_expired_partitions(*, now: dt.datetime | None = None, using: str | None = None) -> list[str]:
    """Drop the partitions of every UTC day that ended more than the longest queue retention ago (with no queue,
    the default retention). Returns the tables dropped. Both parents are locked first, never one while waiting
    for the other (migration 0041: queue_app_lock_history, up to 2 s, then lock_not_available); waits are bounded
    by `lock_timeout` where the caller sets it (within_lock_timeout)."""
    now = now or dt.datetime.now(dt.UTC)
    kept = max(retentions(using=using).values(), default=queue_settings.DEFAULT_RETENTION_DAYS * 86_400.0)
    horizon = now - dt.timedelta(seconds=kept)
    expired = [
        table
        for table, day in partitions(using=using)
        if dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC) <= horizon
    ]
    if not expired:
        return []
    wrapper = queue_connection(using)
    # DDL: not a statement PostgreSQL can prepare. The lock lasts until the caller's transaction ends, or this one.
    with atomic(using), wrapper.cursor() as cur:
        cur.execute(sql.LOCK_HISTORY_PARENTS)  # both parents, never one while waiting for the other (sql.py)
        for table in expired:
            cur.execute(psql.SQL(sql.DROP_PARTITION).format(table=psql.Identifier(table)).as_string(wrapper.connection))
    return expired


def pruned_by_rows(kept: dict[str, float]) -> dict[str, float]:
    """The queues (name -> retention in seconds) whose archived rows go row by row rather than with their day:
    those keeping less than the longest retention (their days outlive them), and those keeping less than a
    partition's span (a day would hold up to a day more than they asked)."""
    longest = max(kept.values(), default=0.0)
    return {queue: seconds for queue, seconds in kept.items() if seconds < longest or seconds < PARTITION_SPAN}


def shortest_row_retention(*, using: str | None = None) -> float | None:
    """The shortest retention, in seconds, of the queues pruned row by row (`pruned_by_rows`); None when none is."""
    return min(pruned_by_rows(retentions(using=using)).values(), default=None)


def prune_history(limit: int = 10_000, *, using: str | None = None) -> int:
    """Delete archived items (and their reservations) older than their queue's retention, for the queues
    `pruned_by_rows` names (the rest goes by partition drop). At most `limit` per queue."""
    deleted = 0
    # Django's own cursor: planned for this queue and moment (which partitions, how many of its rows), not a
    # generic plan that may have been made on an empty partition; a maintenance statement, not the hot path.
    with queue_connection(using).cursor() as cur:
        for queue, seconds in pruned_by_rows(retentions(using=using)).items():
            cur.execute(sql.PRUNE_HISTORY, {"queue": queue, "retention": seconds, "limit": limit})
            deleted += cur.fetchone()[0]
    return deleted
