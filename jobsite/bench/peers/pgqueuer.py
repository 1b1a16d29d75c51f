"""PgQueuer (PostgreSQL, asyncio, FOR UPDATE SKIP LOCKED + LISTEN/NOTIFY; Oban-like in design): `factory`
here is what its workers run (`work()`, as `pgq run` would), each on one psycopg connection to the scratch
database the bench gives it.

PgQueuer deletes a job when it finishes (and logs it in pgqueuer_log), so finished jobs never slow the queue.
Settings tried: worker processes x batch size (jobs fetched per dequeue); drain mode exits when empty.
"""

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pgqueuer
import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

from . import DSN_ENV, Client, Peer, Variant
from .probe import record_start


@asynccontextmanager
async def factory() -> AsyncIterator[QueueManager]:
    async with await psycopg.AsyncConnection.connect(os.environ[DSN_ENV], autocommit=True) as conn:
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            return None

        @qm.entrypoint("probe")
        async def probe(job: Job) -> None:
            record_start(int(job.payload))

        yield qm


def work(batch_size: int, drain: bool = True) -> None:
    """One worker process until the queue is empty (`drain`), or until stopped: what `pgq run --mode drain`
    does (its CLI's --log-level handling is broken in 1.6.0, so the bench calls the library's own
    `pgqueuer.run`)."""
    run = pgqueuer.run(
        factory,
        batch_size=batch_size,
        mode=QueueExecutionMode.drain if drain else QueueExecutionMode.continuous,
        dequeue_timeout=timedelta(seconds=1),
    )
    asyncio.run(run)


class _Client:
    """PgQueuer's enqueue on one connection, driven by an event loop of its own (the feeder's and the prober's)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._conn = self._loop.run_until_complete(
            psycopg.AsyncConnection.connect(os.environ[DSN_ENV], autocommit=True)
        )
        self._queries = Queries(PsycopgDriver(self._conn))

    def noops(self, n: int) -> None:
        self._loop.run_until_complete(self._queries.enqueue(["noop"] * n, [None] * n, [0] * n))

    def probe(self, n: int) -> None:
        self._loop.run_until_complete(self._queries.enqueue("probe", str(n).encode()))

    def close(self) -> None:
        self._loop.run_until_complete(self._conn.close())
        self._loop.close()


class PgQueuerPeer(Peer):
    name = "pgqueuer"
    distribution = "pgqueuer"

    def variants(self) -> list[Variant]:
        return [
            Variant("1 proc, batch 100", 1, {"batch": 100}),
            Variant("2 procs, batch 50", 2, {"batch": 50}),
            Variant("1 proc, batch 10 (default)", 1, {"batch": 10}),
            Variant("2 procs, batch 200", 2, {"batch": 200}),
        ]

    def setup(self) -> None:
        self.ctx.fresh_database(self.name)
        proc = subprocess.run(
            [sys.executable, "-m", "pgqueuer", "--pg-dsn", self.dsn, "install"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pgq install failed: {(proc.stderr or proc.stdout).strip()[-500:]}")

    def reset(self) -> None:
        self.scalar("TRUNCATE pgqueuer, pgqueuer_log")

    def enqueue(self, n: int) -> None:
        async def go() -> None:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                queries = Queries(PsycopgDriver(conn))
                for start in range(0, n, 5_000):
                    size = min(5_000, n - start)
                    await queries.enqueue(["noop"] * size, [None] * size, [0] * size)

        asyncio.run(go())

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        return self.start_work(
            f"work({int(variant.options['batch'])}, drain={probe_file is None})", variant, log, probe_file
        )

    @classmethod
    def open_client(cls) -> Client:
        return _Client()

    def remaining(self) -> int:
        return self.scalar("SELECT count(*) FROM pgqueuer")
