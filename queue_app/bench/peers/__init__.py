"""Peer queues on the same PostgreSQL (and Redis where they need it), one module per peer, each a `Peer`.

Every peer is measured the same way: its own scratch database, N no-op jobs queued in bulk with the peer's own
API, worker processes started as real subprocesses, then `drain()` samples the peer's count of unfinished jobs
until it reaches zero. Each peer lists a few settings (`Variant`: processes x concurrency, connection reuse,
deleting finished jobs where the peer offers it); the bench tries them and keeps the best.

Peers are an optional extra (`pip install -e .[bench]`); a peer that is not installed is reported as n/a.
"""

import importlib
import importlib.metadata
import subprocess
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..context import BenchContext, Drain, drain, log_tail, stop, tune
from ..report import PEER_LABELS, Figure, Results
from ..sizes import Sizes

# name -> "module:class", imported only when the peer runs (its package may not be installed).
PEERS = {
    "procrastinate": "queue_app.bench.peers.procrastinate:ProcrastinatePeer",
    "django_tasks_db": "queue_app.bench.peers.django_tasks_db:DjangoTasksDbPeer",
    "celery_redis": "queue_app.bench.peers.celery_redis:CeleryRedisPeer",
    "pgqueuer": "queue_app.bench.peers.pgqueuer:PgQueuerPeer",
    "django_q2": "queue_app.bench.peers.django_q2:DjangoQ2Peer",
}


@dataclass(frozen=True)
class Variant:
    """One set of settings tried for a peer."""

    label: str
    processes: int = 1
    options: dict[str, Any] = field(default_factory=dict)


class Peer:
    """A peer queue under test. Subclasses say how to set it up, queue jobs, start workers and count what is
    left; `measure()` does the rest."""

    name: str = ""
    distribution: str = ""  # the PyPI package whose version is reported
    stop_grace = 15.0  # seconds its workers get to exit on SIGTERM once the backlog is drained, then SIGKILL

    def __init__(self, ctx: BenchContext) -> None:
        self.ctx = ctx
        self.db = ctx.db_name(self.name)
        self.dsn = ctx.server.conninfo(self.db)
        self._conn: psycopg.Connection | None = None
        self._tries = 0

    def scalar(self, query: str) -> Any:
        """Run one statement in the peer's database on a connection kept open (the drain samples often)."""
        if self._conn is None or self._conn.closed:
            self._conn = self.ctx.server.connect(self.db)
        cur = self._conn.execute(query)
        return cur.fetchone()[0] if cur.description else None

    def variants(self) -> list[Variant]:
        raise NotImplementedError

    def setup(self) -> None:
        """Create the peer's scratch database and schema."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget every job of the previous try."""
        raise NotImplementedError

    def enqueue(self, n: int) -> None:
        raise NotImplementedError

    def start(self, variant: Variant, log: str) -> list[subprocess.Popen]:
        raise NotImplementedError

    def remaining(self) -> int:
        """Jobs queued or running (not finished)."""
        raise NotImplementedError

    def teardown(self) -> None:
        """Close the sampling connection; subclasses also release what is not in the scratch database."""
        if self._conn is not None:
            self._conn.close()

    def version(self) -> str:
        return importlib.metadata.version(self.distribution)

    def attempt(self, variant: Variant, jobs: int, timeout: float) -> Drain:
        """One try: `jobs` no-ops queued, the variant's workers started, the backlog drained, workers stopped."""
        say = self.ctx.progress
        self.reset()
        self.enqueue(jobs)
        log = f"peer-{self.name}-{self._tries}"
        self._tries += 1
        procs = self.start(variant, log)
        try:
            result = drain(
                self.remaining,
                jobs,
                procs,
                timeout=timeout,
                report=lambda m: say("peers", f"{self.name} [{variant.label}] {m}"),
            )
        finally:
            stop(procs, grace=self.stop_grace)
        if result.complete:
            say("peers", f"{self.name} [{variant.label}] {jobs:,} jobs: {result.steady_per_s:,.0f} jobs/s")
        elif result.wall_seconds >= timeout:
            say("peers", f"{self.name} [{variant.label}]: given up after {timeout:.0f}s, {result.done}/{jobs} done")
        else:
            tail = log_tail(self.ctx.log_path(log), 5)
            say("peers", f"{self.name} [{variant.label}]: workers exited, {result.done}/{jobs} done\n{tail}")
        return result

    def measure(self, sizes: Sizes) -> Figure:
        key, label = f"peer.{self.name}", f"peer: {PEER_LABELS[self.name]} {self.version()}"
        self.setup()
        tried, best = tune(self.variants()[: sizes.peer_variants], self.attempt, jobs=sizes.peer_jobs, sizes=sizes)
        detail = {"tries": [{"settings": v.label, **r.as_dict()} for v, r in tried]}
        if best is None:
            return Figure(key, label, None, "jobs/s", note="n/a (no try finished)", detail=detail)
        return Figure(key, label, best[1].steady_per_s, "jobs/s", note=best[0].label, detail=detail)


def load(name: str) -> type[Peer]:
    module, cls = PEERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def run(ctx: BenchContext, sizes: Sizes, results: Results, names: list[str] | tuple[str, ...]) -> None:
    for name in names:
        key, label = f"peer.{name}", f"peer: {PEER_LABELS[name]}"
        try:
            peer = load(name)(ctx)
        except ImportError as exc:
            ctx.progress("peers", f"{name}: not installed ({exc}); pip install -e '.[bench]'")
            results.add(Figure(key, label, None, "jobs/s", note="n/a (not installed)"))
            continue
        ctx.progress("peers", f"{name} {peer.version()}: from {sizes.peer_jobs:,} no-op jobs per try")
        try:
            results.add(peer.measure(sizes))
        except Exception as exc:  # one broken peer must not lose the others' figures
            ctx.progress("peers", f"{name} failed: {exc!r}")
            results.add(Figure(key, label, None, "jobs/s", note=f"n/a (error: {str(exc)[:80]})"))
        finally:
            peer.teardown()
