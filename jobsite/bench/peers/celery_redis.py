"""Celery with Redis as broker (127.0.0.1:6379, database 13 unless JOBSITE_BENCH_REDIS_URL says otherwise).
`app` here is also what its workers load (`celery -A jobsite.bench.peers.celery_redis worker`).

Results are ignored (no result backend: Celery's fastest setting), so the no-op counts its own completion with
one Redis INCR, about 0.05 ms, which is how the bench knows when the backlog is done. Settings tried: several
solo workers (one process each, the usual advice for tiny tasks), prefork and thread pools, prefetch multiplier.
Only this bench's keys are deleted afterwards; the Redis database is never flushed.
"""

import os
import subprocess
import sys
from pathlib import Path

import redis
from celery import Celery

from ..context import spawn
from . import Client, Peer, Variant
from .probe import PROBE_FILE_ENV, record_start

REDIS_URL = os.environ.get("JOBSITE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
QUEUE = "jobsite_bench"
DONE_KEY = "jobsite_bench:done"
# kombu's Redis transport keeps unacked messages and the queue binding under these keys.
KOMBU_KEYS = ("unacked", "unacked_index", "unacked_mutex", f"_kombu.binding.{QUEUE}")

app = Celery("jobsite_bench", broker=REDIS_URL)
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=int(os.environ.get("JOBSITE_BENCH_PREFETCH", "64")),
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    worker_disable_rate_limits=True,
    broker_connection_retry_on_startup=True,
)

_counter: redis.Redis | None = None


@app.task(name="noop")
def noop() -> None:
    global _counter
    if _counter is None:
        _counter = redis.Redis.from_url(REDIS_URL)
    _counter.incr(DONE_KEY)


@app.task(name="probe")
def probe(n: int) -> None:
    record_start(n)


class _Client:
    """Celery's apply_async through one producer (the feeder's and the prober's)."""

    def __init__(self) -> None:
        self._producer = app.producer_pool.acquire(block=True)

    def noops(self, n: int) -> None:
        for _ in range(n):
            noop.apply_async(producer=self._producer)

    def probe(self, n: int) -> None:
        probe.apply_async((n,), producer=self._producer)

    def close(self) -> None:
        self._producer.release()


class CeleryRedisPeer(Peer):
    name = "celery_redis"
    distribution = "celery"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.queued = 0

    def variants(self) -> list[Variant]:
        return [
            Variant("4 solo workers, prefetch 64", 4, {"pool": "solo", "concurrency": 1, "prefetch": 64}),
            Variant("2 solo workers, prefetch 64", 2, {"pool": "solo", "concurrency": 1, "prefetch": 64}),
            Variant("prefork -c 2, prefetch 64", 1, {"pool": "prefork", "concurrency": 2, "prefetch": 64}),
            Variant("threads -c 8, prefetch 64", 1, {"pool": "threads", "concurrency": 8, "prefetch": 64}),
            Variant("2 solo workers, prefetch 4", 2, {"pool": "solo", "concurrency": 1, "prefetch": 4}),
        ]

    def setup(self) -> None:
        self.redis.ping()

    def reset(self) -> None:
        self.redis.delete(QUEUE, DONE_KEY, *KOMBU_KEYS)
        self.queued = 0

    def enqueue(self, n: int) -> None:
        with app.producer_or_acquire() as producer:
            for _ in range(n):
                noop.apply_async(producer=producer)
        self.queued = n

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        # A Celery worker keeps running when the queue is empty: the bench stops it once the backlog is done.
        env = {**self.client_env(), "JOBSITE_BENCH_PREFETCH": str(variant.options["prefetch"])}
        if probe_file is not None:
            env[PROBE_FILE_ENV] = str(probe_file)
        args = [sys.executable, "-m", "celery", "-A", __name__, "worker", "-Q", QUEUE, "-l", "WARNING"]
        args += ["--pool", variant.options["pool"], "--concurrency", str(variant.options["concurrency"])]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        return [
            spawn([*args, "-n", f"bench{i}@%h"], env=env, log=self.ctx.log_path(log)) for i in range(variant.processes)
        ]

    def client_env(self) -> dict[str, str]:
        # Without DJANGO_SETTINGS_MODULE: Celery's Django fixup would set up jobsite's settings in its processes
        # and check jobsite's database, which they do not use (a worker hangs at start when that check fails).
        return {k: v for k, v in super().client_env().items() if k != "DJANGO_SETTINGS_MODULE"}

    @classmethod
    def open_client(cls) -> Client:
        return _Client()

    def remaining(self) -> int:
        return self.queued - int(self.redis.get(DONE_KEY) or 0)

    def teardown(self) -> None:
        self.reset()
        self.redis.close()
        super().teardown()
