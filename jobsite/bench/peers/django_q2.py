"""django-q2 with its Django ORM broker (`Q_CLUSTER["orm"]`: jobs are rows of django_q_ormq in the scratch
database, leased by a lock timestamp), run under its own minimal settings (django_q_settings.py).

One `qcluster` process is a sentinel with a pusher (dequeues `bulk` jobs per query, polls every `poll` seconds
when empty), `workers` worker processes and a monitor that acknowledges (deletes) each finished job; the bench
counts the rows left. Settings tried: workers, bulk size, poll interval, one or two clusters, with room in the
cluster's in-memory queue for two bulks per worker (`queue_limit`). Finished jobs are not stored
(`save_limit: -1`).
"""

import json
import subprocess
import sys
from pathlib import Path

import django_q  # noqa: F401  (not installed: the bench reports this peer as n/a)

from ..context import spawn
from . import Variant
from .django_app import DjangoAppPeer

TABLE = "django_q_ormq"


class DjangoQ2Peer(DjangoAppPeer):
    name = "django_q2"
    distribution = "django-q2"
    settings_module = "jobsite.bench.peers.django_q_settings"
    jobs_module = "jobsite.bench.peers.django_q_jobs"
    stop_grace = 3.0  # a drained cluster logs "stopping" on SIGTERM but does not always exit

    def variants(self) -> list[Variant]:
        return [
            Variant("4 workers, bulk 50, poll 0.05 s", 1, {"workers": 4, "bulk": 50, "poll": 0.05}),
            Variant("2 workers, bulk 50, poll 0.05 s", 1, {"workers": 2, "bulk": 50, "poll": 0.05}),
            Variant("8 workers, bulk 100, poll 0.05 s", 1, {"workers": 8, "bulk": 100, "poll": 0.05}),
            Variant("2 clusters x 2 workers, bulk 50", 2, {"workers": 2, "bulk": 50, "poll": 0.05}),
            Variant("4 workers, bulk 1 (default), poll 0.2 s", 1, {"workers": 4, "bulk": 1, "poll": 0.2}),
        ]

    def reset(self) -> None:
        self.scalar(f"TRUNCATE {TABLE}")

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        # A cluster keeps running when the queue is empty: the bench stops it once the backlog is done.
        cluster = {**variant.options, "queue_limit": variant.options["workers"] * variant.options["bulk"] * 2}
        env = self.env(probe_file, JOBSITE_BENCH_Q_CLUSTER=json.dumps(cluster))
        return [
            spawn([sys.executable, "-m", "django", "qcluster"], env=env, log=self.ctx.log_path(log))
            for _ in range(variant.processes)
        ]

    def remaining(self) -> int:
        return self.scalar(f"SELECT count(*) FROM {TABLE}")
