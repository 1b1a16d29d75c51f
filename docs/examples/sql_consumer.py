"""A jobsite consumer outside Django: lease items through the SQL API, run them, settle them with fencing.

Needs only psycopg (3). Each lease and each settle is a transaction of its own: an item is leased (a new
reservation id: its fencing token), handled, then completed with its result or failed with its error. A settle
whose reservation is no longer current (the lease expired and another consumer took the item) changes nothing
and returns False: the handler's work must then be treated as not counted.

    python docs/examples/sql_consumer.py postgresql://localhost/jobsite default
"""

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

Handler = Callable[[str, Any], Any]


def lease(conn: psycopg.Connection, queue: str, n: int = 10, lease_seconds: float = 30.0) -> list[tuple]:
    """Up to `n` items of `queue`: (reservation_id, item_id, task, payload, attempt) each, committed."""
    with conn.transaction():
        rows = conn.execute(
            "SELECT reservation_id, item_id, task, payload, attempt FROM jobsite_lease(%s, %s, %s, 'sql-consumer')",
            (queue, n, lease_seconds),
        ).fetchall()
    return rows


def complete(conn: psycopg.Connection, reservation_id: int, result: Any = None) -> bool:
    """Done with `result` (JSON); False when the reservation was stale (nothing changed)."""
    with conn.transaction():
        row = conn.execute("SELECT jobsite_complete(%s, %s::jsonb)", (reservation_id, json.dumps(result))).fetchone()
    return row[0]


def fail(conn: psycopg.Connection, reservation_id: int, error: str, retry_in: float = 5.0) -> bool:
    """A failed attempt: retried after `retry_in` s while attempts are left, else dead. False when stale."""
    with conn.transaction():
        return conn.execute("SELECT jobsite_fail(%s, %s, %s)", (reservation_id, error, retry_in)).fetchone()[0]


def run_once(conn: psycopg.Connection, queue: str, handlers: dict[str, Handler], n: int = 10) -> int:
    """Lease a batch, handle each item, settle it; returns how many items were leased."""
    rows = lease(conn, queue, n)
    for reservation_id, _item_id, task, payload, _attempt in rows:
        handler = handlers.get(task)
        if handler is None:
            fail(conn, reservation_id, f"no handler for {task} in this consumer")
            continue
        try:
            result = handler(task, payload)
        except Exception as exc:  # the handler's failure is the item's, not the consumer's
            fail(conn, reservation_id, f"{type(exc).__name__}: {exc}")
        else:
            complete(conn, reservation_id, result)
    return len(rows)


def main(dsn: str, queue: str) -> None:
    handlers: dict[str, Handler] = {"queue_app.echo": lambda task, payload: payload}
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            if not run_once(conn, queue, handlers):
                time.sleep(1.0)  # or LISTEN jobsite_queue and wait for a notification naming the queue


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
