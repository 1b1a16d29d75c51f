"""The probes, one task per delivery mode: `queue_app.probe` (at-least-once), `queue_app.probe_at_most_once`,
`queue_app.probe_transactional`; and two chunked ones (`queue_app.probe_chunk`, at-least-once, and
`queue_app.probe_chunk_at_most_once`: `ChunkPolicy(size=20, timeout=0.2)`), whose handler call records every item
of its chunk in one statement (so the rows of one call share their `executed_at`), sleeps the longest `sleep` asked
once, and returns an ItemRetry for an item asked to `fail`.

Each run of a probe's handler writes an ExecutionLog row (item, reservation, attempt, pid, worker, time) and
upserts its ProbeEffect (`applied + 1`). In transactional delivery the effect is written inside the handler's
transaction and the log on a connection of its own, so the log survives a rollback; otherwise both go in one
autocommit statement. Counting those rows is how anyone checks the guarantees from outside. Probe payload:
`{"sleep": seconds, "fail": true}` (both optional: sleep after recording, then fail if asked).
"""

import json
import os
import threading
import time
from typing import Any

import psycopg

from .. import engine, stages
from ..engine.alias import connection
from ..registry import ChunkItem, ChunkPolicy, Context, Delivery, ItemRetry, job


class ProbeFailed(Exception):
    """Raised on purpose by a probe asked to fail."""


PROBE_HARD_TIMEOUT = 5.0

_LOG_EXECUTION = """
INSERT INTO queue_app_executionlog (item_id, reservation_id, attempt, task, delivery, pid, worker_id, executed_at)
VALUES (%(item_id)s, %(reservation_id)s, %(attempt)s, %(task)s, %(delivery)s, %(pid)s, %(worker_id)s,
        clock_timestamp())
"""
_APPLY_EFFECT = """
INSERT INTO queue_app_probeeffect AS e (key, applied, applied_at) VALUES (%(key)s, 1, clock_timestamp())
ON CONFLICT (key) DO UPDATE SET applied = e.applied + 1, applied_at = clock_timestamp()
"""
# Outside a transaction both writes go in one statement: one commit per run.
_LOG_AND_APPLY = f"WITH log AS ({_LOG_EXECUTION}) {_APPLY_EFFECT}"

# A chunk's runs: one row each (statement_timestamp(): the same for every item of the call), one effect each.
_LOG_AND_APPLY_CHUNK = """
WITH r AS (
    SELECT * FROM jsonb_to_recordset(%(runs)s::jsonb) AS r(item_id bigint, reservation_id bigint, attempt integer,
        task text, delivery text, pid integer, worker_id text, key text)
), log AS (
    INSERT INTO queue_app_executionlog (item_id, reservation_id, attempt, task, delivery, pid, worker_id, executed_at)
    SELECT item_id, reservation_id, attempt, task, delivery, pid, worker_id, statement_timestamp() FROM r
)
INSERT INTO queue_app_probeeffect AS e (key, applied, applied_at) SELECT key, 1, clock_timestamp() FROM r
ON CONFLICT (key) DO UPDATE SET applied = e.applied + 1, applied_at = clock_timestamp()
"""
PROBE_CHUNK = ChunkPolicy(size=20, timeout=0.2)

_log_connections = threading.local()


def _run_record(ctx: Context) -> dict[str, Any]:
    return {
        "item_id": ctx.item_id,
        "reservation_id": ctx.reservation_id,
        "attempt": ctx.attempt,
        "task": ctx.task,
        "delivery": ctx.delivery.value,
        "pid": os.getpid(),
        "worker_id": ctx.worker_id,
        "key": str(ctx.item_id),
    }


def _log_connection(*, fresh: bool = False) -> psycopg.Connection:
    conn = getattr(_log_connections, "conn", None)
    if fresh or conn is None or conn.closed or getattr(_log_connections, "pid", None) != os.getpid():
        if conn is not None and getattr(_log_connections, "pid", None) == os.getpid():
            conn.close()
        conn = engine.dedicated_connection()
        _log_connections.conn, _log_connections.pid = conn, os.getpid()
    return conn


def _log_execution(record: dict[str, Any]) -> None:
    """Record a run on a connection of its own (one per process and thread), committed at once, whatever
    becomes of the handler's transaction. A kept connection the server dropped meanwhile (a restart, an idle
    timeout, a terminated backend) is replaced and the record written on the new one: the statement never
    reached a server on the dropped one (it was idle between runs), so it is written once."""
    conn = _log_connection()
    try:
        conn.execute(_LOG_EXECUTION, record)
    except psycopg.OperationalError:
        if not conn.broken:
            raise
        _log_connection(fresh=True).execute(_LOG_EXECUTION, record)


def close_log_connection() -> None:
    """Close this thread's execution-log connection (it is otherwise kept for the life of the process)."""
    conn = getattr(_log_connections, "conn", None)
    if conn is not None:
        conn.close()
        _log_connections.conn = None


def _probe(payload: Any, ctx: Context) -> dict[str, Any]:
    if stages.on:  # the bench's latency split: the handler's first line (queue_app/stages.py)
        stages.first_line(ctx.reservation_id)
    record = _run_record(ctx)
    if ctx.delivery is Delivery.TRANSACTIONAL:
        _log_execution(record)  # survives the rollback of the handler's transaction
        with connection.cursor() as cur:
            cur.execute(_APPLY_EFFECT, record)  # commits with the settle, or not at all
    else:
        with connection.cursor() as cur:
            cur.execute(_LOG_AND_APPLY, record)
    options = payload if isinstance(payload, dict) else {}
    if options.get("sleep"):
        time.sleep(float(options["sleep"]))
    if options.get("fail"):
        raise ProbeFailed(f"probe asked to fail (attempt {ctx.attempt})")
    return {"pid": os.getpid(), "attempt": ctx.attempt}


probe = job("queue_app.probe", hard_timeout=PROBE_HARD_TIMEOUT)(_probe)
probe_at_most_once = job(
    "queue_app.probe_at_most_once", delivery=Delivery.AT_MOST_ONCE, hard_timeout=PROBE_HARD_TIMEOUT
)(_probe)
probe_transactional = job(
    "queue_app.probe_transactional", delivery=Delivery.TRANSACTIONAL, hard_timeout=PROBE_HARD_TIMEOUT
)(_probe)
# Their items are the ones a worker with the stage times on stamps (queue_app/stages.py): _probe stamps the last.
stages.TASKS.update(task.name for task in (probe, probe_at_most_once, probe_transactional))


def _probe_chunk(items: list[ChunkItem]) -> list[Any]:
    with connection.cursor() as cur:
        cur.execute(_LOG_AND_APPLY_CHUNK, {"runs": json.dumps([_run_record(item.ctx) for item in items])})
    options = [item.payload if isinstance(item.payload, dict) else {} for item in items]
    time.sleep(max((float(o.get("sleep") or 0) for o in options), default=0.0))
    return [
        ItemRetry(f"probe asked to fail (attempt {item.ctx.attempt})") if o.get("fail") else {"chunk": len(items)}
        for item, o in zip(items, options, strict=True)
    ]


probe_chunk = job("queue_app.probe_chunk", chunk=PROBE_CHUNK, hard_timeout=PROBE_HARD_TIMEOUT)(_probe_chunk)
probe_chunk_at_most_once = job(
    "queue_app.probe_chunk_at_most_once",
    chunk=PROBE_CHUNK,
    delivery=Delivery.AT_MOST_ONCE,
    hard_timeout=PROBE_HARD_TIMEOUT,
)(_probe_chunk)
