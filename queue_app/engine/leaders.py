"""Leader rows: which process does a duty that spans transactions, and until when (sql.TAKE_LEADER and the
statements after it; the table is models.Leader).

One leader per duty: the wake-up leader of a queue set (worker/listener.py) and the one VACUUM or ANALYZE of the
hot tables at a time (engine/maintenance.py). The holder takes the duty with an expiry of `ttl()` seconds and
renews every duty it holds with its heartbeat (`renew`); a holder that dies leaves its row to expire, and the next
process to ask then takes it over. Nothing here lives in a session: the same statements work on a direct
connection and through a transaction pooler, and a row outlives no holder by more than `ttl()`.
"""

from datetime import datetime
from typing import Any

import psycopg

from ..conf import queue_settings
from . import sql
from .db import cursor

# The duty of the hot tables' VACUUM and ANALYZE: one at a time in the whole deployment.
TABLE_MAINTENANCE = "vacuum-analyze"


def ttl() -> float:
    """Seconds a duty stays with a holder that stopped renewing it: as long as other workers wait before they
    call a silent worker lost (its heartbeat renews its duties about three times within that)."""
    return float(queue_settings.WORKER_LOST_AFTER)


def wake_duty(key: str) -> str:
    return f"wake {key}"


def _run(statement: str, params: dict[str, Any], conn: psycopg.Connection | None, using: str) -> list[tuple]:
    if conn is not None:
        return conn.execute(statement, params).fetchall()
    with cursor(using) as cur:
        cur.execute(statement, params)
        return cur.fetchall()


def take(
    duty: str,
    holder: str,
    *,
    seconds: float | None = None,
    conn: psycopg.Connection | None = None,
    using: str | None = None,
) -> bool:
    """Take `duty` for `holder` (or renew it when held already) unless another holds it unexpired. On `conn`
    (a psycopg connection in autocommit) or Django's connection `using`."""
    params = {"duty": duty, "holder": holder, "ttl": float(ttl() if seconds is None else seconds)}
    return bool(_run(sql.TAKE_LEADER, params, conn, using))


def renew(holder: str, *, using: str | None = None) -> set[str]:
    """Every duty `holder` holds runs on for another ttl(); returns those duties."""
    return {row[0] for row in _run(sql.RENEW_LEADERS, {"holder": holder, "ttl": ttl()}, None, using)}


def release(
    holder: str, duty: str | None = None, *, conn: psycopg.Connection | None = None, using: str | None = None
) -> None:
    """Hand `duty` back (None: every duty of `holder`)."""
    statement = sql.RELEASE_LEADER
    if conn is not None:
        conn.execute(statement, {"holder": holder, "duty": duty})
        return
    with cursor(using) as cur:
        cur.execute(statement, {"holder": holder, "duty": duty})


def leader_of(duty: str, *, using: str | None = None) -> tuple[str, datetime] | None:
    """Who holds `duty` and until when (an expired row included), or None."""
    rows = _run(sql.LEADER_OF, {"duty": duty}, None, using)
    return rows[0] if rows else None
