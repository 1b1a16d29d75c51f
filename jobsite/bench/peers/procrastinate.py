"""Procrastinate (PostgreSQL, asyncio worker, LISTEN/NOTIFY): `app` here is also what its worker loads
(`procrastinate --app=jobsite.bench.peers.procrastinate.app worker`); the connection comes from the
environment the bench gives the worker.

Best settings tried: worker processes x `--concurrency` (async jobs per process), `--delete-jobs always`
(finished jobs are deleted instead of kept), `--one-shot` so a worker exits when the queue is empty.
"""

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import procrastinate

from ..context import spawn
from . import DSN_ENV, Client, Peer, Variant
from .probe import PROBE_FILE_ENV, record_start

logging.getLogger("procrastinate").setLevel(logging.WARNING)  # its INFO lines would drown the progress

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="noop")
async def noop() -> None:
    return None


@app.task(name="probe")
async def probe(n: int) -> None:
    record_start(n)


class _Client:
    """Procrastinate's synchronous defer on one connection (the feeder's and the prober's)."""

    def __init__(self) -> None:
        self._open = contextlib.ExitStack()
        connector = procrastinate.SyncPsycopgConnector(conninfo=os.environ[DSN_ENV])
        self._open.enter_context(app.replace_connector(connector))
        self._open.enter_context(app.open())

    def noops(self, n: int) -> None:
        noop.batch_defer(*({} for _ in range(n)))

    def probe(self, n: int) -> None:
        probe.defer(n=n)

    def close(self) -> None:
        self._open.close()


class ProcrastinatePeer(Peer):
    name = "procrastinate"
    distribution = "procrastinate"

    def variants(self) -> list[Variant]:
        return [
            Variant("2 procs x 10 async, delete jobs", 2, {"concurrency": 10, "delete": "always"}),
            Variant("1 proc x 10 async, delete jobs", 1, {"concurrency": 10, "delete": "always"}),
            Variant("1 proc x 50 async, delete jobs", 1, {"concurrency": 50, "delete": "always"}),
            Variant("4 procs x 5 async, delete jobs", 4, {"concurrency": 5, "delete": "always"}),
            Variant("2 procs x 10 async, keep jobs", 2, {"concurrency": 10, "delete": "never"}),
        ]

    def _connector(self) -> procrastinate.SyncPsycopgConnector:
        return procrastinate.SyncPsycopgConnector(conninfo=self.dsn)

    def setup(self) -> None:
        self.ctx.fresh_database(self.name)
        with app.replace_connector(self._connector()), app.open():
            app.schema_manager.apply_schema()

    def reset(self) -> None:
        self.scalar("TRUNCATE procrastinate_jobs CASCADE")

    def enqueue(self, n: int) -> None:
        with app.replace_connector(self._connector()), app.open():
            for start in range(0, n, 5_000):
                noop.batch_defer(*({} for _ in range(min(5_000, n - start))))

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        args = [sys.executable, "-m", "procrastinate", "--log-level", "warning", f"--app={__name__}.app", "worker"]
        args += ["--concurrency", str(variant.options["concurrency"]), "--delete-jobs", variant.options["delete"]]
        env = {**os.environ, DSN_ENV: self.dsn}
        if probe_file is None:
            args.append("--one-shot")  # exits once the queue is empty
        else:
            env[PROBE_FILE_ENV] = str(probe_file)
        return [spawn(args, env=env, log=self.ctx.log_path(log)) for _ in range(variant.processes)]

    @classmethod
    def open_client(cls) -> Client:
        return _Client()

    def remaining(self) -> int:
        return self.scalar("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
