"""django-tasks-db (`django_tasks_db.DatabaseBackend`, the ORM backend for Django's `django.tasks`), run under
its own minimal settings (django_tasks_settings.py) in a scratch database.

Its worker, `manage.py db_worker`, runs one task at a time per process, so the settings tried are the number of
worker processes and persistent connections (CONN_MAX_AGE=None) or not. `--batch` makes a worker exit when the
queue is empty. It has no option to delete finished jobs (pruning is a separate command), so they stay.
"""

import subprocess
import sys
from pathlib import Path

import django_tasks_db  # noqa: F401  (not installed: the bench reports this peer as n/a)

from ..context import spawn
from . import Variant
from .django_app import DjangoAppPeer

TABLE = "django_tasks_database_dbtaskresult"  # its app label is django_tasks_database


class DjangoTasksDbPeer(DjangoAppPeer):
    name = "django_tasks_db"
    distribution = "django-tasks-db"
    settings_module = "jobsite.bench.peers.django_tasks_settings"
    jobs_module = "jobsite.bench.peers.django_tasks_jobs"

    def variants(self) -> list[Variant]:
        return [
            Variant("2 db_worker procs, persistent conns", 2, {"conn_max_age": "none"}),
            Variant("4 db_worker procs, persistent conns", 4, {"conn_max_age": "none"}),
            Variant("1 db_worker proc, persistent conns", 1, {"conn_max_age": "none"}),
            Variant("2 db_worker procs, conn per request", 2, {"conn_max_age": "0"}),
        ]

    def reset(self) -> None:
        self.scalar(f"TRUNCATE {TABLE}")

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        env = self.env(probe_file, JOBSITE_BENCH_CONN_MAX_AGE=variant.options["conn_max_age"])
        until_empty = ["--batch"] if probe_file is None else []  # --batch: exit once the queue is empty
        return [
            spawn(
                [sys.executable, "-m", "django", "db_worker", *until_empty, "--no-startup-delay", "--no-reload"]
                + ["--interval", "0.1", "--verbosity", "0", "--worker-id", f"bench-{i}"],
                env=env,
                log=self.ctx.log_path(log),
            )
            for i in range(variant.processes)
        ]

    def remaining(self) -> int:
        return self.scalar(f"SELECT count(*) FROM {TABLE} WHERE status IN ('READY', 'RUNNING')")
