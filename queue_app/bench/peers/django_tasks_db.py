"""django-tasks-db (`django_tasks_db.DatabaseBackend`, the ORM backend for Django's `django.tasks`), run under
its own minimal settings (django_tasks_settings.py) in a scratch database.

Its worker, `manage.py db_worker`, runs one task at a time per process, so the settings tried are the number of
worker processes and persistent connections (CONN_MAX_AGE=None) or not. `--batch` makes a worker exit when the
queue is empty. It has no option to delete finished jobs (pruning is a separate command), so they stay.
"""

import os
import subprocess
import sys

import django_tasks_db  # noqa: F401  (not installed: the bench reports this peer as n/a)

from ..context import spawn
from . import Peer, Variant

SETTINGS = "queue_app.bench.peers.django_tasks_settings"
JOBS = "queue_app.bench.peers.django_tasks_jobs"
TABLE = "django_tasks_database_dbtaskresult"  # its app label is django_tasks_database


class DjangoTasksDbPeer(Peer):
    name = "django_tasks_db"
    distribution = "django-tasks-db"

    def variants(self) -> list[Variant]:
        return [
            Variant("2 db_worker procs, persistent conns", 2, {"conn_max_age": "none"}),
            Variant("4 db_worker procs, persistent conns", 4, {"conn_max_age": "none"}),
            Variant("1 db_worker proc, persistent conns", 1, {"conn_max_age": "none"}),
            Variant("2 db_worker procs, conn per request", 2, {"conn_max_age": "0"}),
        ]

    def _env(self, conn_max_age: str = "none") -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "JOBSITE_BENCH_PEER_DSN": self.dsn,
            "JOBSITE_BENCH_CONN_MAX_AGE": conn_max_age,
            "PYTHONUNBUFFERED": "1",
        }

    def _run(self, *args: str) -> None:
        proc = subprocess.run([sys.executable, *args], env=self._env(), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")

    def setup(self) -> None:
        self.ctx.fresh_database(self.name)
        self._run("-m", "django", "migrate", "--verbosity", "0")

    def reset(self) -> None:
        self.scalar(f"TRUNCATE {TABLE}")

    def enqueue(self, n: int) -> None:
        code = f"import django; django.setup(); from {JOBS} import enqueue; enqueue({int(n)})"
        self._run("-c", code)

    def start(self, variant: Variant, log: str) -> list[subprocess.Popen]:
        env = self._env(variant.options["conn_max_age"])
        return [
            spawn(
                [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay", "--no-reload"]
                + ["--interval", "0.1", "--verbosity", "0", "--worker-id", f"bench-{i}"],
                env=env,
                log=self.ctx.log_path(log),
            )
            for i in range(variant.processes)
        ]

    def remaining(self) -> int:
        return self.scalar(f"SELECT count(*) FROM {TABLE} WHERE status IN ('READY', 'RUNNING')")
