"""Peer queues on the same PostgreSQL (and Redis where they need it), one module per peer, each a `Peer`.

Every peer is measured the same way: its own scratch database, N no-op jobs queued in bulk with the peer's own
API, worker processes started as real subprocesses, then `drain()` samples the peer's count of unfinished jobs
until it reaches zero. Each peer lists a few settings (`Variant`: processes x concurrency, connection reuse,
deleting finished jobs where the peer offers it); the bench tries them and keeps the best.

Then enqueue-to-start at one load every peer sustains (`common_load`: the sizes' `peer_latency_load`, lower if
half of a peer's or jobsite's throughput is less), p50 and p99 for each peer and for jobsite in the same run
(driver.py says how), printed side by side.

Peers are an optional extra (`pip install -e .[bench]`); a peer that is not installed is reported as n/a.
"""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import psycopg

from ..context import BenchContext, Drain, drain, log_tail, spawn, stop, tune
from ..report import PEER_LABELS, Figure, Results, percentile
from ..sizes import Sizes
from .probe import PROBE_FILE_ENV

DSN_ENV = "JOBSITE_BENCH_PEER_DSN"  # the peer's scratch database, for its workers and its clients
LOAD_SHARE = 0.5  # the common load is at most this share of any measured throughput
STEADY = 1.0  # seconds of feeding before the first counted probe
FLOOR = "pg_floor"  # the peer that is the floor (pg_floor.py): also measured at jobsite's half load


class Client(Protocol):
    """A peer's producer in the feeder and prober processes (driver.py), connected once."""

    def noops(self, n: int) -> None: ...

    def probe(self, n: int) -> None: ...

    def close(self) -> None: ...


# name -> "module:class", imported only when the peer runs (its package may not be installed).
PEERS = {
    "procrastinate": "jobsite.bench.peers.procrastinate:ProcrastinatePeer",
    "django_tasks_db": "jobsite.bench.peers.django_tasks_db:DjangoTasksDbPeer",
    "celery_redis": "jobsite.bench.peers.celery_redis:CeleryRedisPeer",
    "pgqueuer": "jobsite.bench.peers.pgqueuer:PgQueuerPeer",
    "django_q2": "jobsite.bench.peers.django_q2:DjangoQ2Peer",
    "pg_floor": "jobsite.bench.peers.pg_floor:PgFloorPeer",  # not a product: the durable floor (pg_floor.py)
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

    def start(self, variant: Variant, log: str, *, probe_file: Path | None = None) -> list[subprocess.Popen]:
        """The variant's workers. For a throughput try they exit once the queue is empty; with `probe_file`
        (the latency measure) they keep running until stopped and run `probe` jobs too, their starts written
        there (probe.record_start)."""
        raise NotImplementedError

    def start_work(self, call: str, variant: Variant, log: str, probe_file: Path | None) -> list[subprocess.Popen]:
        """`variant.processes` workers, each `python -c "from <the peer's module> import work; <call>"` with the
        scratch database (and the probe file) in its environment: for the peers whose worker is a function of
        their own module (pgqueuer, pg_floor)."""
        args = [sys.executable, "-c", f"from {type(self).__module__} import work; {call}"]
        env = {**os.environ, DSN_ENV: self.dsn, **({PROBE_FILE_ENV: str(probe_file)} if probe_file else {})}
        return [spawn(args, env=env, log=self.ctx.log_path(log)) for _ in range(variant.processes)]

    @classmethod
    def open_client(cls) -> Client:
        """In a feeder or prober process (driver.py), whose environment is `client_env()`."""
        raise NotImplementedError

    def client_env(self) -> dict[str, str]:
        return {**os.environ, DSN_ENV: self.dsn, "PYTHONUNBUFFERED": "1"}

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

    def measure_latency(self, variant: Variant, per_s: float, samples: int) -> list[Figure]:
        """Enqueue-to-start p50 and p99 over `samples` probes while `per_s` no-ops a second flow through the
        variant's workers (driver.py)."""
        log = f"peer-{self.name}-latency"
        probe_file = self.ctx.log_path(f"{log}-starts")
        probe_file.write_text("")
        self.reset()
        env = {**self.client_env(), PROBE_FILE_ENV: str(probe_file)}
        driver = [sys.executable, "-m", "jobsite.bench.peers.driver"]
        children: list[subprocess.Popen] = []

        def child(*args: str, name: str) -> subprocess.Popen:
            with self.ctx.log_path(f"{log}-{name}").open("w") as err:
                proc = subprocess.Popen(
                    [*driver, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                    start_new_session=True,
                )  # fmt: skip
            children.append(proc)
            return proc

        def expect(proc: subprocess.Popen, word: str, name: str) -> str:
            line = proc.stdout.readline() or ""
            if word not in line:
                raise RuntimeError(f"the {name} failed:\n{log_tail(self.ctx.log_path(f'{log}-{name}'))}")
            return line

        procs = self.start(variant, log, probe_file=probe_file)
        try:
            prober = child("probe", self.name, str(samples), str(probe_file), name="prober")
            expect(prober, "warm", "prober")  # a first probe ran: the workers are up
            feeder = child("feed", self.name, str(per_s), name="feeder")
            expect(feeder, "started", "feeder")
            time.sleep(STEADY)
            prober.stdin.write("go\n")
            prober.stdin.flush()
            ms = json.loads(expect(prober, '"ms"', "prober"))["ms"]
            feeder.terminate()
            fed = json.loads(expect(feeder, '"fed"', "feeder"))["fed"]
        finally:
            stop(children, grace=5.0)
            stop(procs, grace=self.stop_grace)
        p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
        where = f"{self.name} [{variant.label}] enqueue-to-start at {per_s:,.0f}/s"
        self.ctx.progress("peers", f"{where}: p50 {p50:.2f} ms, p99 {p99:.2f} ms over {len(ms)} probes, fed {fed:,}")
        detail = {"samples": len(ms), "load_per_s": per_s, "fed": fed, "max_ms": round(max(ms), 3)}
        label = f"{PEER_LABELS[self.name]} {self.version()}"
        return [
            Figure(f"latency.{self.name}_p50", f"{label} p50", p50, "ms", note=variant.label, detail=detail),
            Figure(f"latency.{self.name}_p99", f"{label} p99", p99, "ms", note=variant.label, detail=detail),
        ]

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


def common_load(sizes: Sizes, rates: list[float | None]) -> float:
    """The load of the side-by-side latency: the sizes' target, or LOAD_SHARE of the slowest measured
    throughput (jobsite's and every peer's) when that is lower, in whole tens of items a second."""
    measured = [LOAD_SHARE * rate for rate in rates if rate]
    return max(10.0, (min([sizes.peer_latency_load, *measured]) // 10) * 10)


def run(ctx: BenchContext, sizes: Sizes, results: Results, names: list[str] | tuple[str, ...]) -> None:
    # Here, not at the top: jobsite_side imports jobsite's engine, which a peer's own processes (run under its
    # settings: driver.py's feeder and prober) cannot import.
    from ..jobsite_side import measure_common_latency

    winners: dict[str, Variant] = {}
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
            figure = results.add(peer.measure(sizes))
            if figure.value:
                winners[name] = next(v for v in peer.variants() if v.label == figure.note)
        except Exception as exc:  # one broken peer must not lose the others' figures
            ctx.progress("peers", f"{name} failed: {exc!r}")
            results.add(Figure(key, label, None, "jobs/s", note=f"n/a (error: {str(exc)[:80]})"))
        finally:
            peer.teardown()
    rates = [results.value(f"peer.{name}") for name in winners] + [results.value("jobsite.e2e")]
    per_s = common_load(sizes, rates)
    ctx.progress("peers", f"enqueue-to-start side by side at {per_s:,.0f} items/s, {sizes.latency_samples} probes each")
    for figure in measure_common_latency(ctx, sizes, results, per_s):
        results.add(figure)
    for name, variant in winners.items():
        peer = load(name)(ctx)
        try:
            for figure in peer.measure_latency(variant, per_s, sizes.latency_samples):
                results.add(figure)
        except Exception as exc:  # reported beside the others as n/a
            ctx.progress("peers", f"{name} latency failed: {exc!r}")
            note = f"n/a (error: {str(exc)[:80]})"
            results.add(Figure(f"latency.{name}_p50", f"{PEER_LABELS[name]} p50", None, "ms", note=note))
        finally:
            peer.teardown()
    if FLOOR in winners:
        floor_at_half_load(ctx, sizes, results, winners[FLOOR])


def floor_at_half_load(ctx: BenchContext, sizes: Sizes, results: Results, variant: Variant) -> None:
    """The floor's enqueue-to-start under jobsite's half load (the rate of `jobsite.latency_load_*`, same run):
    the tail that load leaves a queue with no more than the shortest durable path, on this machine's cores
    shared by the server, the workers, the feeder and the prober. Keys ceiling.load_start_p50/_p99, jobsite's
    half-load figures read over them."""
    half = results.figures.get("jobsite.latency_load_p99")
    per_s = half.detail.get("load_per_s") if half and half.value is not None else None
    if not per_s:
        return
    peer = load(FLOOR)(ctx)
    try:
        p50, p99 = peer.measure_latency(variant, per_s, sizes.latency_samples)
    except Exception as exc:  # the other figures stand without it
        ctx.progress("peers", f"{FLOOR} at {per_s:,.0f}/s failed: {exc!r}")
        return
    finally:
        peer.teardown()
    where = f"floor: enqueue-to-start under a steady {per_s:,.0f} items/s (bare psycopg)"
    for q, figure in (("p50", p50), ("p99", p99)):
        results.add(replace(figure, key=f"ceiling.load_start_{q}", label=f"{where}, {q}"))
