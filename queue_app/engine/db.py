"""Connection plumbing for the engine: Django's own connection, so engine calls join the caller's
`transaction.atomic()` and commit or roll back with it.

The engine's statements are long CTEs whose planning costs more than their execution on a small batch (about
2.5 ms against 1 ms for a lease of one item), so `cursor()` runs them as server-side prepared statements: each
connection plans a statement once and then only binds parameters. That needs server-side binding, which
Django's own cursor does not use by default, so the statement runs on a plain psycopg cursor over Django's
connection (same transaction, same type loaders, errors translated to Django's as usual).
`JOBSITE["PREPARED_STATEMENTS"] = False` turns this off, e.g. behind a connection pooler in transaction mode
that does not track prepared statements.
"""

from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import queue_settings
from . import sql

TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
_TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(TIMESTAMPTZ, psycopg.pq.Format.TEXT)

# psycopg prepares a statement asked with prepare=True at once, and any other after this many runs: never, in
# effect (Django's own cursors bind on the client and are never prepared anyway).
NEVER_BY_COUNT = 1 << 30


class PreparedCursor:
    """A cursor over Django's connection `using` whose every execute is a prepared statement."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self._wrapper = wrapper
        # What Django's own cursor() does first, without making a cursor of its own on the hot path.
        wrapper.close_if_health_check_failed()
        wrapper.ensure_connection()
        wrapper.validate_thread_sharing()
        raw = wrapper.connection
        if raw.prepare_threshold is None:  # Django's default: psycopg prepares nothing, not even on request
            raw.prepare_threshold = NEVER_BY_COUNT
        self.cursor = psycopg.Cursor(raw)
        # psycopg's own timestamptz loader (C, in the session's time zone: UTC, as Django sets it) rather than
        # Django's, which wraps it in Python to set a tzinfo: a sixth of a busy worker's CPU went to the three
        # timestamps of each lease.
        self.cursor.adapters.register_loader(TIMESTAMPTZ, _TIMESTAMPTZ_LOADER)

    def execute(self, query: str, params: Any = None) -> "PreparedCursor":
        with self._wrapper.wrap_database_errors:
            self.cursor.execute(query, params, prepare=True)
        return self

    def fetchone(self) -> Any:
        with self._wrapper.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self._wrapper.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount

    def close(self) -> None:
        self.cursor.close()

    def __enter__(self) -> "PreparedCursor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cursor(using: str = "default") -> Any:
    """A cursor for the engine's statements: prepared per connection unless PREPARED_STATEMENTS is off."""
    wrapper = connections[using]
    if queue_settings.PREPARED_STATEMENTS and wrapper.vendor == "postgresql":
        return PreparedCursor(wrapper)
    return wrapper.cursor()


def tune_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Django's connection_created receiver: generic plans for the engine's prepared statements, no JIT (see
    sql.ENGINE_SESSION). Runs in autocommit, before any transaction the connection was opened for, so the
    settings last as long as the connection. Skipped without prepared statements (behind a transaction-mode
    pooler, where session settings would leak to other clients)."""
    if connection.vendor == "postgresql" and queue_settings.PREPARED_STATEMENTS:
        with connection.cursor() as cur:
            cur.execute(sql.ENGINE_SESSION)
