"""The floor: the least a durable queue on PostgreSQL does to start a job, hand-written on psycopg and measured as
a peer, so the side-by-side shows what PostgreSQL itself costs on this machine beside what each queue adds.

A job is a row. The enqueue is one statement in its own transaction: the INSERT and a NOTIFY, committed durably
(`synchronous_commit` on, the server's default). A worker process LISTENs on one connection and leases on another:
woken by the notification, one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING`, committed
durably (so no job is handed out twice after a crash), its rows put on a queue that threads already waiting take
them from; a thread runs the handler and hands the id back; the loop deletes finished ids in batches.

Nothing else: no retries, leases that expire, fencing, priorities, limits, history or admin. It is not a queue to
use; it is the shortest durable path from an enqueue to a handler, the physical floor against which jobsite's
(and each peer's) enqueue-to-start is read.
"""

import os
import queue
import subprocess
import threading
from pathlib import Path

import psycopg

from . import DSN_ENV, Client, Peer, Variant
from .probe import record_start

CHANNEL = "floor_job"
SCHEMA = """
CREATE TABLE floor_job (id bigserial PRIMARY KEY, kind text NOT NULL, payload bigint, leased boolean NOT NULL
    DEFAULT false);
CREATE INDEX floor_job_ready ON floor_job (id) WHERE NOT leased;
"""
ENQUEUE = f"WITH j AS (INSERT INTO floor_job (kind, payload) VALUES (%s, %s)) SELECT pg_notify('{CHANNEL}', '')"
ENQUEUE_MANY = f"""WITH j AS (INSERT INTO floor_job (kind) SELECT 'noop' FROM generate_series(1, %s))
SELECT pg_notify('{CHANNEL}', '')"""
LEASE = """UPDATE floor_job SET leased = true
WHERE id IN (SELECT id FROM floor_job WHERE NOT leased ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload"""
DONE = "DELETE FROM floor_job WHERE id = ANY(%s)"
WAIT = 1.0  # seconds the loop waits for a notification before it leases again anyway


def _handler(todo: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
    while True:
        job_id, kind, payload = todo.get()
        if kind == "probe":
            record_start(payload)
        done.put(job_id)


def work(threads: int, batch: int, drain: bool = True) -> None:
    """One worker process: `threads` handler threads, leases of up to `batch` jobs, at most `batch` (or twice the
    threads, if more) held.
    Exits once the queue is empty (`drain`), else runs until killed. A notification that comes while the loop is
    busy waits on the listening connection, so none is missed between an empty lease and the wait."""
    dsn = os.environ[DSN_ENV]
    listener = psycopg.connect(dsn, autocommit=True)
    listener.execute(f"LISTEN {CHANNEL}")
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(threads):
        threading.Thread(target=_handler, args=(todo, done), daemon=True).start()
    held, cap = 0, max(batch, 2 * threads)
    while True:
        finished = []
        while not done.empty():
            finished.append(done.get())
        if finished:
            conn.execute(DONE, [finished])
            held -= len(finished)
        rows = conn.execute(LEASE, [min(batch, cap - held)]).fetchall() if held < cap else []
        for row in rows:
            todo.put(row)
        held += len(rows)
        if rows:
            continue
        if held:
            done.put(done.get())  # wait for a thread to finish; its id is deleted next round
        elif drain:
            return
        else:
            for _ in listener.notifies(timeout=WAIT, stop_after=1):
                pass


class _Client:
    def __init__(self) -> None:
        self._conn = psycopg.connect(os.environ[DSN_ENV], autocommit=True, prepare_threshold=0)

    def noops(self, n: int) -> None:
        self._conn.execute(ENQUEUE_MANY, [n])

    def probe(self, n: int) -> None:
        self._conn.execute(ENQUEUE, ["probe", n])

    def close(self) -> None:
        self._conn.close()


class PgFloorPeer(Peer):
    name = "pg_floor"
    distribution = "psycopg"
    stop_grace = 5.0

    def variants(self) -> list[Variant]:
        return [
            Variant("2 procs x 4 threads, batch 100", 2, {"threads": 4, "batch": 100}),
            Variant("1 proc x 8 threads, batch 500", 1, {"threads": 8, "batch": 500}),
        ]

    def setup(self) -> None:
        self.ctx.fresh_database(self.name)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)

    def reset(self) -> None:
        self.scalar("TRUNCATE floor_job")

    def enqueue(self, n: int) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for start in range(0, n, 5_000):
                conn.execute(ENQUEUE_MANY, [min(5_000, n - start)])

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        options = variant.options
        call = f"work({int(options['threads'])}, {int(options['batch'])}, drain={probe_file is None})"
        return self.start_work(call, variant, log, probe_file)

    @classmethod
    def open_client(cls) -> Client:
        return _Client()

    def remaining(self) -> int:
        return self.scalar("SELECT count(*) FROM floor_job")
