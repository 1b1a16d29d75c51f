"""Who waits on a lock a test holds: the sessions PostgreSQL says a backend blocks (pg_blocking_pids), read on a
connection of its own in autocommit. pg_stat_activity is read once per transaction: a look from inside one keeps
seeing its first answer.

A blocked session's `query` is not always the statement that waits: in a CI run the maintenance thread's
session, blocked on the history table's lock, showed its session set-up statement (ENGINE_SESSION's set_config)
as its query. What it waits for is in pg_locks, its lock not granted: `relations_awaited`."""

import psycopg
from django.db import connection


def blocked_by(pid: int) -> list[tuple[int, str]]:
    """(pid, query) of each session the backend `pid` blocks."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as look:
        query = "SELECT pid, query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        return look.execute(query, [pid]).fetchall()


def relations_awaited(pid: int) -> list[str]:
    """The relations the sessions the backend `pid` blocks are waiting to lock (their locks not granted)."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as look:
        query = """SELECT l.relation::regclass::text FROM pg_locks l
                   WHERE NOT l.granted AND l.relation IS NOT NULL AND %s = ANY(pg_blocking_pids(l.pid))"""
        return [row[0] for row in look.execute(query, [pid]).fetchall()]
