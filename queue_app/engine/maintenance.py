"""Maintenance duties of the engine, each one statement: rescue expired leases, prune done items and
expired dedup claims, vacuum the hot tables when dead rows pile up, analyze them when they outgrow their
statistics. The worker runs them on their own intervals under an advisory lock (transaction-scoped), VACUUM and
ANALYZE under the leader row of their duty (engine/leaders.py)."""

import contextlib
import os
import socket
import time

from psycopg import sql as psql

from ..conf import queue_settings
from . import leaders, sql
from .db import cursor
from .pooler import pooled
from .workers import dedicated_connection

# Every lease, settle and prune leaves dead rows in these; the rest of the schema changes slowly.
# The hand-off's offers too: a row inserted and deleted for every item handed off, so its dead rows (and its
# primary key's entries) grow with the traffic until a VACUUM, where autovacuum is off or behind; vacuumed
# sooner than the others (bloated_tables' `min_dead_offers`).
HOT_TABLES = (sql.ITEM, sql.RESERVATION, sql.DEDUP, sql.DEAD_LETTER, sql.HANDOFF)


def rescue_expired(limit: int = 1000, *, lost_after: float | None = None, using: str | None = None) -> tuple[int, int]:
    """Expired leases, and leases of workers silent for `lost_after` seconds (default WORKER_LOST_AFTER), go
    back to ready (attempt counted) or, on their last attempt, to the dead letters. Returns (rescued, dead)."""
    if lost_after is None:
        lost_after = queue_settings.WORKER_LOST_AFTER
    with cursor(using) as cur:
        cur.execute(sql.RESCUE_EXPIRED, {"limit": limit, "lost_after": float(lost_after)})
        rescued, died = cur.fetchone()
    return rescued, died


def prune_done(limit: int = 10_000, *, using: str | None = None) -> int:
    """Delete done items older than their queue's retention (their reservations go with them)."""
    with cursor(using) as cur:
        cur.execute(sql.PRUNE_DONE, {"limit": limit})
        return cur.rowcount


def prune_dedup_claims(*, using: str | None = None) -> int:
    with cursor(using) as cur:
        cur.execute(sql.PRUNE_DEDUP)
        return cur.rowcount


def bloated_tables(
    min_dead: int = 20_000, share: float = 0.1, min_dead_offers: int = 1_000, *, using: str | None = None
) -> list[str]:
    """The hot tables, and history partitions, with more than `min_dead` dead rows (the hand-off's offers:
    `min_dead_offers`) and more than `share` of their live rows dead."""
    params = {"tables": list(HOT_TABLES), "min_dead": min_dead, "share": share, "min_dead_offers": min_dead_offers}
    with cursor(using) as cur:
        cur.execute(sql.BLOATED_TABLES, params)
        return [row[0] for row in cur.fetchall()]


def stale_statistics(
    growth: int = 4, min_rows: int = 1_000, min_pages: int = 16, every: float = 60.0, *, using: str | None = None
) -> list[str]:
    """The hot tables grown past `growth` times what their statistics say, or whose rows have all changed since
    their last ANALYZE, that one more than `every` seconds ago (see sql.STALE_STATISTICS)."""
    params = {"tables": list(HOT_TABLES), "growth": growth, "min_rows": min_rows, "min_pages": min_pages}
    params["every"] = float(every)
    with cursor(using) as cur:
        cur.execute(sql.STALE_STATISTICS, params)
        return [row[0] for row in cur.fetchall()]


def analyze(tables: list[str], *, holder: str | None = None, using: str | None = None) -> dict[str, float] | None:
    """ANALYZE each table, skipping one another ANALYZE or an autovacuum holds (it brings them up to date itself).
    The new statistics make every session plan its statements on that table again. Returns the seconds each
    took, or None when another worker's VACUUM or ANALYZE was running (see _each). On a connection of its own,
    in autocommit: it never waits inside a caller's transaction."""
    return _each(sql.ANALYZE, tables, using, holder)


def vacuum(tables: list[str], *, holder: str | None = None, using: str | None = None) -> dict[str, float] | None:
    """VACUUM each table on a connection of its own (VACUUM cannot run in a transaction), skipping a table
    another VACUUM holds. Returns the seconds each took, or None when another worker's VACUUM or ANALYZE was
    running (see _each). Queue tables churn: the server's autovacuum may be off (it is on some CI servers),
    throttled or busy elsewhere, and a lease then walks past ever more dead index entries while the tables
    grow."""
    return _each(sql.VACUUM, tables, using, holder)


def _each(statement: str, tables: list[str], using: str, holder: str | None) -> dict[str, float] | None:
    """Run `statement` on each table as the leader of the table maintenance duty (leaders.TABLE_MAINTENANCE):
    one VACUUM or ANALYZE of the hot tables at a time in the whole deployment. Every worker runs the units; two
    at once (one worker's VACUUM of the items beside another's of the reservations) took both cores of a 2-core
    host for most of a second, and the leases waited (enqueue-to-start p99 146-280 ms at 7,000 items/s, 60-73 ms
    one at a time). A worker that finds the duty taken does nothing (None): the unit looks again on its next
    turn. The duty is renewed before each table (and by the worker's heartbeat: `holder` is its worker id) and
    handed back at the end; a holder that dies leaves it for leaders.ttl() seconds at most."""
    holder = holder or f"{socket.gethostname()}:{os.getpid()}"
    took: dict[str, float] = {}
    with dedicated_connection(using=using) as conn:
        if not leaders.take(leaders.TABLE_MAINTENANCE, holder, conn=conn):
            return None
        if not pooled():
            # A VACUUM of a big table may outlast the role's statement_timeout (an operator's 5 s), and it cannot
            # run in a transaction for a SET LOCAL: no limit on this connection of its own, closed at the end.
            # Behind a transaction pooler a SET would stay on the server connection: the role's limit applies.
            conn.execute("SET statement_timeout = 0")
        try:
            for table in tables:
                if took and not leaders.take(leaders.TABLE_MAINTENANCE, holder, conn=conn):
                    break  # lost it (held past its expiry without a heartbeat): the new holder goes on
                t0 = time.monotonic()
                conn.execute(psql.SQL(statement).format(table=psql.Identifier(table)))
                took[table] = round(time.monotonic() - t0, 3)
        finally:
            with contextlib.suppress(Exception):  # a broken connection: the row expires instead
                leaders.release(holder, leaders.TABLE_MAINTENANCE, conn=conn)
    return took
