"""Connection plumbing for the engine: Django's own connection, so engine calls join the caller's
`transaction.atomic()` (on the queue's alias, JOBSITE["DATABASE"]: engine/alias.py) and commit or roll back with it.

The engine's statements are long CTEs whose planning costs more than their execution on a small batch (about
2.5 ms against 1 ms for a lease of one item), so `cursor()` runs them as server-side prepared statements: each
connection plans a statement once and then only binds parameters. That needs server-side binding, which
Django's own cursor does not use by default, so the statement runs on a plain psycopg cursor over Django's
connection (same transaction, same type loaders, errors translated to Django's as usual).
`JOBSITE["PREPARED_STATEMENTS"] = False` turns this off; so does `JOBSITE["CONNECTION_POOLER"] = "transaction"`
(a pooled server connection is handed to another client after each transaction: nothing may outlive one).

The session settings the prepared statements want (sql.ENGINE_SESSION) are set on the worker's own connections
only (its loop, lease and maintenance threads: `engine_session_here()`), never on the rest of the project's:
a web process, a handler's thread or child keeps PostgreSQL's defaults.
"""

import os
import struct
import sys
import threading
from array import array
from typing import Any

import psycopg
from django.db import InterfaceError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.adapt import Dumper

from ..conf import queue_settings
from . import sql
from .alias import queue_connection
from .pooler import pooled

TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
_TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(TIMESTAMPTZ, psycopg.pq.Format.TEXT)

# psycopg prepares a statement asked with prepare=True at once, and any other after this many runs: never, in
# effect (Django's own cursors bind on the client and are never prepared anyway).
NEVER_BY_COUNT = 1 << 30


# -- id and result arrays in binary ----------------------------------------------------------------------------
# A settle names every item and reservation it settles: two bigint[] of a batch's size and a jsonb[] of results.
# psycopg's list dumpers build them element by element in Python (3.4 ms for a batch of 1,000, a text literal the
# server then parses): about a tenth of a busy worker's own CPU. These build the binary array format (what the
# server's array_recv reads) with a few C-level operations: ~0.2 ms an id array. Only where the value is an
# Int8Array or a JsonbArray and the placeholder is %s or %b; as a text literal (Django's client-side cursor,
# PREPARED_STATEMENTS off) they are the lists they are.

INT8_OID, INT8_ARRAY_OID = 20, 1016
JSONB_OID, JSONB_ARRAY_OID = 3802, 3807
_HEADER = struct.Struct(">iiiii")  # dimensions (1), has nulls, element type, length, lower bound (1)
_EMPTY = struct.Struct(">iii")  # dimensions (0), has nulls (0), element type
_NULL = b"\xff\xff\xff\xff"  # an element's length -1: NULL


class Int8Array(list):
    """A list of ints to send as a bigint[] (ids; each must fit in 64 bits: OverflowError otherwise)."""


class JsonbArray(list):
    """A list of JSON documents, each already encoded as text, or None for SQL NULL, to send as a jsonb[]."""


class _ArrayBinaryDumper(Dumper):
    """A one-dimensional array in the binary format: the header, then each element (its length, its bytes)."""

    format = psycopg.pq.Format.BINARY
    element_oid = 0

    def dump(self, obj: list) -> bytes:
        if not obj:
            return _EMPTY.pack(0, 0, self.element_oid)
        has_nulls, elements = self.elements(obj)
        return _HEADER.pack(1, has_nulls, self.element_oid, len(obj), 1) + elements

    def elements(self, obj: list) -> tuple[bool, bytes]:
        raise NotImplementedError


class _Int8ArrayBinaryDumper(_ArrayBinaryDumper):
    oid, element_oid = INT8_ARRAY_OID, INT8_OID

    def elements(self, obj: list) -> tuple[bool, bytes]:
        n = len(obj)
        values = array("q", obj)
        if sys.byteorder == "little":
            values.byteswap()
        raw = values.tobytes()
        # Each element: its length (int32 8), then its value (int64, network order): strided copies, no loop
        # over the elements in Python.
        body = bytearray(12 * n)
        body[3::12] = b"\x08" * n
        for k in range(8):
            body[4 + k :: 12] = raw[k::8]
        return False, bytes(body)


class _JsonbArrayBinaryDumper(_ArrayBinaryDumper):
    oid, element_oid = JSONB_ARRAY_OID, JSONB_OID

    def elements(self, obj: list) -> tuple[bool, bytes]:
        nulls = obj.count(None)
        if nulls == len(obj):  # most handlers return nothing: a batch of NULLs
            return True, _NULL * nulls
        parts = []
        for text in obj:
            if text is None:
                parts.append(_NULL)
            else:
                data = text.encode()
                parts.append(struct.pack(">ib", len(data) + 1, 1))  # jsonb's binary form: version 1, then the text
                parts.append(data)
        return nulls > 0, b"".join(parts)


# -- arrays dumped once -----------------------------------------------------------------------------------------
# A worker binds its tasks' lease terms on every lease: three arrays as long as its task list. psycopg's list
# dumpers build them element by element on each call (63 us a lease for the 36 tasks of this project, warm), yet
# they are the same on every lease. So they are dumped once, by psycopg's own list dumper in the text format (its
# quoting, its NULLs), and sent as those bytes from then on; the statement's casts (text[], float8[]) read them.
# Django's client-side cursor (PREPARED_STATEMENTS off) quotes them as the literals they are.

FLOAT8_ARRAY_OID = 1022


class TextArrayText(bytes):
    """A text[] in PostgreSQL's text format, dumped once (text_array)."""


class Float8ArrayText(bytes):
    """A float8[] in PostgreSQL's text format, dumped once (float8_array)."""


class _TextArrayTextDumper(Dumper):
    format = psycopg.pq.Format.TEXT
    oid = 0  # unknown, as psycopg sends its own list of str: the statement's `::text[]` says what it is

    def dump(self, obj: bytes) -> bytes:
        return bytes(obj)


class _Float8ArrayTextDumper(_TextArrayTextDumper):
    oid = FLOAT8_ARRAY_OID


_ONCE = psycopg.adapt.Transformer()  # psycopg's global adapters: its own list dumpers


def text_array(values: list[str]) -> TextArrayText:
    return TextArrayText(_ONCE.get_dumper(values, psycopg.adapt.PyFormat.TEXT).dump(values))


def float8_array(values: list[float | None]) -> Float8ArrayText:
    """`values` as a float8[] (floats or None; an empty list is an empty array)."""
    floats = [None if value is None else float(value) for value in values]
    if all(value is None for value in floats):  # no element to take the type from: NULLs, or nothing
        return Float8ArrayText(("{" + ",".join(["NULL"] * len(floats)) + "}").encode())
    return Float8ArrayText(_ONCE.get_dumper(floats, psycopg.adapt.PyFormat.TEXT).dump(floats))


# On psycopg's global map: every connection opened after this import (Django's included) knows them.
psycopg.adapters.register_dumper(Int8Array, _Int8ArrayBinaryDumper)
psycopg.adapters.register_dumper(JsonbArray, _JsonbArrayBinaryDumper)
psycopg.adapters.register_dumper(TextArrayText, _TextArrayTextDumper)
psycopg.adapters.register_dumper(Float8ArrayText, _Float8ArrayTextDumper)


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


def prepared() -> bool:
    """Whether the engine's statements are prepared on the server: PREPARED_STATEMENTS, and no transaction
    pooler in between (PgBouncer 1.21+ can carry protocol-level prepared statements, but 1.18-1.20 and most
    managed poolers cannot, and psycopg's names would collide across clients: off, whatever the version)."""
    return queue_settings.PREPARED_STATEMENTS and not pooled()


def cursor(using: str | None = None) -> Any:
    """A cursor for the engine's statements: prepared per connection unless prepared() says no."""
    wrapper = queue_connection(using)
    if wrapper.vendor == "postgresql" and prepared():
        return PreparedCursor(wrapper)
    return wrapper.cursor()


# The threads (of this process: a forked child inherits the forking thread's locals) whose connections get
# sql.ENGINE_SESSION: the worker's loop, lease thread and maintenance thread.
_engine_thread = threading.local()


def engine_session_here(using: str | None = None) -> None:
    """Mark the calling thread as one of the worker's own: its connections (the one open now, and each it opens
    later) get the engine's session settings, unless the statements are not prepared (then the settings have
    nothing to act on, and behind a transaction pooler they would leak to other clients)."""
    _engine_thread.pid = os.getpid()
    wrapper = queue_connection(using)
    if wrapper.connection is not None:
        try:
            _apply_engine_session(wrapper)
        except (OperationalError, InterfaceError):  # the server dropped it (restarted since): the next one is tuned
            wrapper.close()


def _is_engine_thread() -> bool:
    return getattr(_engine_thread, "pid", None) == os.getpid()


def _apply_engine_session(connection: BaseDatabaseWrapper) -> None:
    if connection.vendor == "postgresql" and prepared():
        with connection.cursor() as cur:
            cur.execute(sql.ENGINE_SESSION)


def tune_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Django's connection_created receiver: on the worker's own threads (engine_session_here), generic plans
    for the engine's prepared statements and no JIT (see sql.ENGINE_SESSION). Runs in autocommit, before any
    transaction the connection was opened for, so the settings last as long as the connection. Any other
    connection of the project (a web request's, a handler's, a command's) is left as it opened."""
    if _is_engine_thread():
        _apply_engine_session(connection)
