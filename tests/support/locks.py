"""Who waits on a lock a test holds: the sessions PostgreSQL says a backend blocks (pg_blocking_pids), read on a
connection of its own in autocommit. pg_stat_activity is read once per transaction: a look from inside one keeps
seeing its first answer."""

import psycopg
from django.db import connection


def blocked_by(pid: int) -> list[tuple[int, str]]:
    """(pid, query) of each session the backend `pid` blocks."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as look:
        query = "SELECT pid, query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        return look.execute(query, [pid]).fetchall()
