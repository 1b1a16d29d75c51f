"""Procrastinate (PostgreSQL, asyncio worker, LISTEN/NOTIFY): `app` here is also what its worker loads
(`procrastinate --app=queue_app.bench.peers.procrastinate.app worker`); the connection comes from the
environment the bench gives the worker.

Best settings tried: worker processes x `--concurrency` (async jobs per process), `--delete-jobs always`
(finished jobs are deleted instead of kept), `--one-shot` so a worker exits when the queue is empty.
"""

import logging
import os
import subprocess
import sys

import procrastinate

from ..context import spawn
from . import Peer, Variant

DSN_ENV = "JOBSITE_BENCH_PEER_DSN"

logging.getLogger("procrastinate").setLevel(logging.WARNING)  # its INFO lines would drown the progress

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="noop")
async def noop() -> None:
    return None


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

    def start(self, variant: Variant, log: str) -> list[subprocess.Popen]:
        args = [sys.executable, "-m", "procrastinate", "--log-level", "warning", f"--app={__name__}.app"]
        args += ["worker", "--one-shot", "--concurrency", str(variant.options["concurrency"])]
        args += ["--delete-jobs", variant.options["delete"]]
        env = {**os.environ, DSN_ENV: self.dsn}
        return [spawn(args, env=env, log=self.ctx.log_path(log)) for _ in range(variant.processes)]

    def remaining(self) -> int:
        return self.scalar("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
