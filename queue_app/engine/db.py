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

import contextlib
import os
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from ..conf import queue_settings
from . import sql

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


def keep_generic_plans(using: str = "default") -> Callable[[], None]:
    """Make this thread's connection `using` a worker's own (sql.WORKER_SESSION: every engine statement planned
    once, generic, no JIT), now and after every reconnect, in this process only (a forked pool child's handlers
    keep PostgreSQL's defaults). For a connection that runs only the engine's statements: a worker's supervisor.
    Returns the undo: stop tuning reconnects and put the open connection's settings back."""
    wrapper, pid = connections[using], os.getpid()
    uid = f"jobsite-worker-session-{id(wrapper)}-{pid}"

    def tune(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        if connection is wrapper and os.getpid() == pid:
            with connection.cursor() as cur:
                cur.execute(sql.WORKER_SESSION)

    def undo() -> None:
        connection_created.disconnect(dispatch_uid=uid)
        if wrapper.connection is not None and not wrapper.connection.closed:
            with contextlib.suppress(Exception), wrapper.cursor() as cur:  # a broken connection goes anyway
                cur.execute(sql.DEFAULT_SESSION)

    if wrapper.vendor != "postgresql":
        return lambda: None
    connection_created.connect(tune, weak=False, dispatch_uid=uid)
    if wrapper.connection is not None:
        tune(None, wrapper)
    return undo
