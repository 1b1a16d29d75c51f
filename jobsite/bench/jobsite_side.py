"""jobsite's own figures, in a scratch database migrated like the real one:

- bulk enqueue: rows/s through `engine.enqueue_many` (validation, JSON encoding and COPY included);
- end-to-end: N `queue_app.noop` items queued, then one `run_worker --burst` process drains them; a few
  (pool, concurrency, batch, prefetch) settings are tried and the best kept (and used by the latency and admin
  parts);
- enqueue-to-start latency on an idle queue and under a steady load (half the end-to-end rate, and a quarter of
  it: where the tail bends): single probe items queued one at a time; the handler's start
  (ExecutionLog.executed_at) minus the item's created_at, p50 and p99;
- the admin change list under load: a separate process (admin_probe.py) GETs the QueueItem change list as a
  superuser while a worker drains a backlog.

The worker parts need `manage.py run_worker`; without it they are reported as n/a.
"""

import contextlib
import copy
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from django.core.management import call_command, get_commands
from django.db import connections, transaction

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.engine.sql import RESERVATION_SEQUENCE

from . import ceiling, stage_split
from .context import ROOT, BenchContext, Drain, django_child_env, drain, log_tail, manage_args, spawn, stop, tune
from .report import Figure, Results, percentile
from .sizes import Sizes

NOOP_TASK = "queue_app.noop"
LOAD_SHARE = 0.5  # the steady load of the latency-under-load measure, as a share of the end-to-end throughput
# The same measure at a lighter load, the flow-control issue's goal being judged at LOAD_SHARE: on the 2-core VM,
# where the server, the workers, the feeder and the probe share the cores, p99 was 10.5 ms at 4,500 items/s,
# 17.7-21.7 at 9,000, 24-42 at 12,000, 35-36 at 14,000 and 41-66 at 18,000 (end to end ~36,000 jobs/s): the
# figure says how far below half the load the 20 ms tail holds, run by run.
QUARTER_SHARE = 0.25
LATENCY_LOADS = (("", 0.0), ("_load", LOAD_SHARE), ("_quarter", QUARTER_SHARE))  # figure key suffix, share
ALIAS = "jobsite_bench"
ENQUEUE_QUEUE = "bench_enqueue"
ENQUEUE_CHUNK = 10_000
ENQUEUE_CALLERS = (1, 2, 4)  # concurrent enqueue_many processes tried; the best counts (the ceiling tries 1-16)
# Each caller count is tried this often, the best kept: one try lasts 2-4 s, and this VM's speed moves by tens
# of percent within minutes (the ceiling keeps the best of five 10 s runs).
ENQUEUE_ROUNDS = 2
POLL_FIRST, POLL_EVERY = 0.025, 0.005  # seconds: how the latency measure waits for each item's run
WORKER_MISSING = "n/a (run_worker missing)"


def run_worker_available() -> bool:
    return "run_worker" in get_commands()


MIGRATED = "migrated"  # the run's first bench_database migrates this one; every part's is a copy of it


@contextmanager
def _on_alias(db: str) -> Iterator[None]:
    """The database `db` reachable in this process as the connection ALIAS, closed after."""
    settings = copy.deepcopy(connections["default"].settings_dict)
    settings["NAME"] = db
    settings["TEST"] = {**settings.get("TEST", {}), "NAME": db}
    connections.settings[ALIAS] = settings
    try:
        yield
    finally:
        connections[ALIAS].close()
        del connections[ALIAS]
        del connections.settings[ALIAS]


@contextmanager
def bench_database(ctx: BenchContext, part: str) -> Iterator[str]:
    """A fresh, migrated scratch database for `part`, reachable in this process as the connection ALIAS. The run
    migrates one database once, the first time, and gives each part a copy of it (CREATE DATABASE ... TEMPLATE:
    about 0.1 s, where a migrate is 2-3 s of this process's CPU and the server's), so a run of every part migrates
    once, not ten times."""
    template = ctx.db_name(MIGRATED)
    if template not in ctx.created:
        ctx.fresh_database(MIGRATED)
        with _on_alias(template):
            call_command("migrate", database=ALIAS, verbosity=0, interactive=False)
        ctx.progress("bench", f"{template} migrated; each part's scratch database is a copy of it")
    db = ctx.fresh_database(part, template=template)
    with _on_alias(db):
        yield db


def _scalar(query: str, params: dict | None = None):
    with connections[ALIAS].cursor() as cur:
        cur.execute(query, params)
        row = cur.fetchone()
    return row[0] if row else None


def _open_items(queue: str) -> int:
    return _scalar(
        "SELECT count(*) FROM queue_app_queueitem WHERE queue_id = %(q)s AND state IN ('ready', 'reserved')",
        {"q": queue},
    )


# The reservation ids handed out so far: one per lease, read from the sequence without reading any table.
_RESERVATIONS_MADE = f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {RESERVATION_SEQUENCE}"


class _Remaining:
    """What the end-to-end drain samples every 0.1 s: the jobs not yet leased, from the reservation ids handed out
    since the drain began (one per lease, O(1)); once every job was leased, the exact count of open items, down
    to none, so the drain's end is the last item done. A count of the open items is a scan of the item table (a
    parallel one: ~190 ms of server CPU at 200,000 items on the 2-core VM); sampled every 0.1 s through the whole
    drain, it took a third of the end-to-end rate from the workers it measured (2 x thread c32 b500 p500, three
    pairs interleaved: 9,402 / 8,994 / 8,873 jobs/s with it, 13,728 / 12,176 / 12,602 without). The steady rate
    is the leases' between 10 % and 90 %: done trails leased by the items in flight (at most the workers'
    prefetch and concurrency), the same at both ends of the window. The done count after the drain stays exact
    (`measure_e2e`)."""

    def __init__(self, queue: str, jobs: int) -> None:
        self.queue, self.jobs = queue, jobs
        self.before = _scalar(_RESERVATIONS_MADE)
        self.all_leased = False

    def __call__(self) -> int:
        if not self.all_leased:
            left = self.jobs - (_scalar(_RESERVATIONS_MADE) - self.before)
            if left > 0:
                return left
            self.all_leased = True
        return _open_items(self.queue)


WorkerSettings = tuple[int, str, int, int, int]  # (run_worker processes, pool, concurrency, batch, prefetch)


def worker_args(settings: WorkerSettings, *, burst: bool) -> list[str]:
    _, pool, concurrency, batch, prefetch = settings
    args = ["run_worker", "--pool", pool, "--concurrency", str(concurrency), "--batch", str(batch)]
    return manage_args(*args, "--prefetch", str(prefetch), "--no-scheduler", *(["--burst"] if burst else []))


def describe(settings: WorkerSettings) -> str:
    processes = f"{settings[0]} x " if settings[0] > 1 else ""
    return processes + "--pool {} --concurrency {} --batch {} --prefetch {}".format(*settings[1:])


def spawn_workers(
    ctx: BenchContext,
    settings: WorkerSettings,
    db: str,
    log: str,
    *,
    burst: bool,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> list[subprocess.Popen]:
    """The host's `run_worker` processes (several share the machine's cores and the lease work); `env`: variables
    over the scratch database's, `extra`: more run_worker arguments."""
    args, env = [*worker_args(settings, burst=burst), *(extra or [])], django_child_env(db, **(env or {}))
    return [spawn(args, env=env, log=ctx.log_path(f"{log}-{n}")) for n in range(settings[0])]


def _enqueue_rows(ctx: BenchContext, db: str, total: int, callers: int) -> tuple[int, float]:
    """`total` rows through enqueue_many by `callers` processes at once (enqueue_probe.py: each its own
    connection, as separate web processes would be), ENQUEUE_CHUNK rows per call. Returns (rows, seconds) from
    the moment all callers are told to start until the last one is done."""
    logs = [ctx.log_path(f"enqueue-probe-{callers}-{n}") for n in range(callers)]
    shares = [total // callers + (1 if n < total % callers else 0) for n in range(callers)]
    with contextlib.ExitStack() as stack:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "jobsite.bench.enqueue_probe", str(share), str(ENQUEUE_CHUNK), ENQUEUE_QUEUE],
                env=django_child_env(db),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stack.enter_context(log.open("w")),
                text=True,
            )
            for share, log in zip(shares, logs, strict=True)
        ]
        stack.callback(lambda: [proc.kill() for proc in procs if proc.poll() is None])
        for proc, log in zip(procs, logs, strict=True):
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"an enqueue probe did not start:\n{log_tail(log)}")
        t0 = time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.stdout.readline() for proc in procs]
        elapsed = time.perf_counter() - t0
        for proc, out, log in zip(procs, outputs, logs, strict=True):
            if proc.wait(30) != 0 or not out:
                raise RuntimeError(f"an enqueue probe failed (exit {proc.returncode}):\n{log_tail(log)}")
    return sum(json.loads(out)["rows"] for out in outputs), elapsed


def measure_enqueue(ctx: BenchContext, sizes: Sizes, db: str) -> Figure:
    engine.enqueue_many(NOOP_TASK, [{}], queue=ENQUEUE_QUEUE, using=ALIAS)  # the queue row exists before the race
    tries: dict[int, tuple[int, float]] = {}  # callers -> the best (rows, seconds) of the rounds
    for _ in range(ENQUEUE_ROUNDS):
        for callers in ENQUEUE_CALLERS:
            _clear_queue(ENQUEUE_QUEUE)  # each try on the same table, not on the rows of the tries before it
            rows, elapsed = _enqueue_rows(ctx, db, sizes.enqueue_rows, callers)
            if callers not in tries or rows / elapsed > tries[callers][0] / tries[callers][1]:
                tries[callers] = (rows, elapsed)
            ctx.progress(
                "jobsite",
                f"bulk enqueue, {callers} caller(s): {rows:,} rows in {elapsed:.2f}s = {rows / elapsed:,.0f} rows/s",
            )
    callers, (rows, elapsed) = max(tries.items(), key=lambda kv: kv[1][0] / kv[1][1])
    # Keep them as history for the admin measure, out of every worker's way.
    _scalar("UPDATE queue_app_queue SET paused = true WHERE name = %(q)s RETURNING 1", {"q": ENQUEUE_QUEUE})
    return Figure(
        "jobsite.enqueue",
        "jobsite: bulk enqueue (enqueue_many)",
        rows / elapsed,
        "rows/s",
        note=f"{callers} concurrent caller(s), {ENQUEUE_CHUNK:,} rows per call",
        detail={
            "rows": rows,
            "seconds": round(elapsed, 3),
            "callers": callers,
            "tries": {str(n): round(r / e) for n, (r, e) in tries.items()},
        },
    )


def _clear_queue(queue: str) -> None:
    """The queue's items gone, hot and archived (the workers' archiver moves finished ones to the history)."""
    with connections[ALIAS].cursor() as cur:
        cur.execute("DELETE FROM queue_app_queueitem WHERE queue_id = %(q)s", {"q": queue})
        cur.execute(
            """WITH gone AS (DELETE FROM queue_app_itemhistory WHERE queue_id = %(q)s RETURNING id)
               DELETE FROM queue_app_reservationhistory WHERE item_id IN (SELECT id FROM gone)""",
            {"q": queue},
        )
        cur.execute("VACUUM ANALYZE queue_app_queueitem")
        cur.execute("VACUUM ANALYZE queue_app_reservation")


def measure_e2e(ctx: BenchContext, sizes: Sizes, db: str) -> tuple[Figure, WorkerSettings | None]:
    queue = queue_settings.DEFAULT_QUEUE
    label = "jobsite: end-to-end no-op, one worker host"
    exits: list[int | None] = []

    def attempt(settings: WorkerSettings, jobs: int, timeout: float) -> Drain:
        _clear_queue(queue)
        engine.enqueue_many(NOOP_TASK, [{} for _ in range(jobs)], queue=queue, using=ALIAS)
        name = "e2e {}x {} c={} b={} p={}".format(*settings)
        log = "jobsite-e2e-{}x-{}-c{}-b{}-p{}-{}".format(*settings, len(exits))
        remaining = _Remaining(queue, jobs)
        procs = spawn_workers(ctx, settings, db, log, burst=True)
        try:
            result = drain(
                remaining,
                jobs,
                procs,
                timeout=timeout,
                report=lambda m: ctx.progress("jobsite", f"{name}: {m}"),
            )
            # A burst worker exits once drained; the worst exit code of the host's workers counts.
            codes = [proc.wait(30) for proc in procs] if result.complete else [None]
            exit_code = None if None in codes else max(codes, key=abs)
        except subprocess.TimeoutExpired:
            exit_code = None
        finally:
            stop(procs)
        exits.append(exit_code)
        # Drained is not done: an item that went dead (unknown task, failure) left the backlog too. Hot and
        # archived alike: the archiver moves done items to the history while the drain runs.
        done = _scalar(
            "SELECT count(*) FROM queue_app_item_all WHERE queue_id = %(q)s AND state = 'done'", {"q": queue}
        )
        if done < jobs:
            if result.wall_seconds >= timeout:
                ctx.progress("jobsite", f"{name}: given up after {timeout:.0f}s, {done}/{jobs} done")
            else:
                tail = log_tail(ctx.log_path(f"{log}-0"), 8)
                ctx.progress("jobsite", f"{name}: only {done}/{jobs} done (exit {exit_code})\n{tail}")
            return replace(result, done=done)
        ctx.progress("jobsite", f"{name} {jobs:,} jobs: {result.steady_per_s:,.0f} jobs/s (exit {exit_code})")
        return result

    tried, best = tune(sizes.e2e_grid, attempt, jobs=sizes.e2e_jobs, sizes=sizes)
    _clear_queue(queue)
    detail = {"tries": [{"settings": describe(s), **r.as_dict()} for s, r in tried], "exit_codes": exits}
    if best is None:
        return Figure("jobsite.e2e", label, None, "jobs/s", note="n/a (no try finished)", detail=detail), None
    settings, result = best
    detail["worker_settings"] = list(settings)  # the peers part measures latency with them too
    return Figure("jobsite.e2e", label, result.steady_per_s, "jobs/s", note=describe(settings), detail=detail), settings


# The statement-alone figure's (connections, batch) variants, each run twice, the best kept: one connection with the
# end-to-end grid's largest batch, and two and three at once (the end-to-end winners run two to four workers).
STATEMENT_VARIANTS = ((1, 1_000), (2, 500), (3, 500))
STATEMENT_WARM_UP_BATCHES = 5  # untimed, before the statistics are brought up to date


def _statement_client(queue: str, batch: int, name: str, start: threading.Barrier, counts: list[int]) -> None:
    """One connection (this thread's own) leasing `batch` at a time and completing them with the next lease."""
    terms = {NOOP_TASK: (None, 0.0)}
    done: list[tuple[engine.Lease, None]] = []
    engine.engine_session_here(ALIAS)  # leases as a worker's lease thread does (engine/db.py)
    try:
        start.wait()
        while True:
            out = engine.settle_and_lease(done, [queue], batch, name, terms=terms, using=ALIAS)
            done = [(lease, None) for lease in out.leases]
            counts.append(len(done))
            if not done:
                return
    finally:
        connections[ALIAS].close()


def _statement_drain(queue: str, jobs: int, clients: int, batch: int) -> float:
    engine.enqueue_many(NOOP_TASK, [{} for _ in range(jobs)], queue=queue, using=ALIAS)
    with connections[ALIAS].cursor() as cur:
        cur.execute("VACUUM ANALYZE queue_app_queueitem")
    start, counts = threading.Barrier(clients + 1), []
    threads = [
        threading.Thread(target=_statement_client, args=(queue, batch, f"bench-statement-{n}", start, counts))
        for n in range(clients)
    ]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    if sum(counts) != jobs:
        raise RuntimeError(f"the statement-alone drain leased {sum(counts)} of {jobs} items")
    return jobs / elapsed


def measure_statement(ctx: BenchContext, sizes: Sizes) -> Figure:
    """jobsite's settle-and-lease statement alone: one to three connections (threads of this process: the client
    side is ~8 us an item, and psycopg lets go of the GIL while the server works) each lease a batch and
    complete it with the next lease until the queue is empty; no worker, no handlers, no pool. What the SQL does
    on this server with this schema (four row writes an item: the lease and its reservation, the complete and
    its reservation's outcome), against which the end-to-end figure shows what the worker costs. The tables'
    statistics are those of a grown reservation table, as a worker's analyze unit keeps them. Best of
    `sizes.statement_rounds` per variant (right after the end-to-end drains, a checkpoint may be writing their
    pages)."""
    queue = queue_settings.DEFAULT_QUEUE
    jobs = max(sizes.e2e_jobs, sizes.statement_jobs)
    # Clearing the queue empties the reservation table (its rows go with their items) and analyzes it so; a plan
    # made on that joins each settle's reservations by reading the whole table once per settled item, a cost
    # growing with the table, which a worker's analyze unit ends within a second. Here nothing would: lease and
    # settle a few batches untimed (each at most a few thousand rows' reading), then analyze the grown tables, as
    # that unit does, and time the drains after it. (Not a whole drain: with ids sent as bigint[], as they are
    # in binary and were past 2^31 before, the plans made on the emptied table stay in use all through it:
    # ~400 items/s.)
    _clear_queue(queue)
    _statement_drain(queue, STATEMENT_WARM_UP_BATCHES * STATEMENT_VARIANTS[0][1], 1, STATEMENT_VARIANTS[0][1])
    with connections[ALIAS].cursor() as cur:
        cur.execute("ANALYZE queue_app_reservation")
        cur.execute("ANALYZE queue_app_queueitem")
    rates: dict[str, list[float]] = {}
    for _ in range(sizes.statement_rounds):
        for clients, batch in STATEMENT_VARIANTS:
            rates.setdefault(f"{clients} x batch {batch:,}", []).append(_statement_drain(queue, jobs, clients, batch))
    _clear_queue(queue)
    best = {variant: max(tries) for variant, tries in rates.items()}
    winner = max(best, key=best.get)
    summary = ", ".join(f"{variant}: {rate:,.0f}" for variant, rate in best.items())
    ctx.progress("jobsite", f"settle-and-lease statement alone (connections x batch, items/s): {summary}")
    label = "jobsite: settle+lease statement alone, no worker"
    note = f"{winner} connection(s) ({summary})"
    detail = {"tries": rates, "jobs": jobs}
    return Figure("jobsite.statement", label, best[winner], "items/s", note=note, detail=detail)


def _wait_for_worker(proc: subprocess.Popen, timeout: float = 30.0) -> bool:
    """Until this worker process has registered itself as running; False if it exits or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if _scalar(
            "SELECT count(*) FROM queue_app_worker WHERE state = 'running' AND pid = %(pid)s", {"pid": proc.pid}
        ):
            return True
        time.sleep(0.1)
    return False


PROBE_TASK = "queue_app.probe"  # records the moment its handler starts (ExecutionLog.executed_at)


class _Feeder:
    """Steady background load: `per_s` no-op items a second from a process of its own (bench/feeder.py)."""

    def __init__(self, db: str, queue: str, per_s: float) -> None:
        self.db, self.queue, self.per_s = db, queue, per_s
        self.proc: subprocess.Popen | None = None
        self.fed = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobsite.bench.feeder", self.queue, str(self.per_s)],
            cwd=ROOT,
            env=django_child_env(self.db),
            stdout=subprocess.PIPE,
            text=True,
        )
        if "started" not in (self.proc.stdout.readline() or ""):
            self.stop()
            raise RuntimeError("the feeder process did not start")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        lines = (out or "").strip().splitlines()
        with contextlib.suppress(json.JSONDecodeError, IndexError, TypeError):
            self.fed = int(json.loads(lines[-1])["fed"])


def measure_latency(
    ctx: BenchContext,
    sizes: Sizes,
    db: str,
    settings: WorkerSettings,
    load_per_s: float = 0.0,
    *,
    suffix: str = "_load",
    share: float = LOAD_SHARE,
    worker_env: dict[str, str] | None = None,
    worker_extra: list[str] | None = None,
    using: str = ALIAS,
    commit_apart: bool = False,
) -> list[Figure]:
    """Enqueue-to-start: single probe items queued one at a time, each waited for; from the clock read just before
    the enqueue call to the handler's first line (the workers' stage times, queue_app/stages.py), as for every peer
    (bench/peers/driver.py). Idle, or while a feeder keeps
    `load_per_s` no-op items a second flowing through the same queue and worker (`share` of the end to end; the
    figures' keys end in `suffix`: jobsite.latency{suffix}_p50 and _p99). `worker_env` and `worker_extra`: the
    worker's environment and arguments over the usual; `using`: the alias the items are enqueued on (the pooler
    part's, through PgBouncer). `commit_apart`: each probe enqueued in a transaction block, so the split times its
    COMMIT apart from its insert (one more round trip each: the split part's; the figures beside the peers enqueue
    in one statement)."""
    queue = queue_settings.DEFAULT_QUEUE
    where = f"under a steady {load_per_s:,.0f} items/s" if load_per_s else "idle"
    suffix = suffix if load_per_s else ""
    _clear_queue(queue)
    log = f"jobsite-latency-{suffix.strip('_') or 'idle'}"
    # The workers' stage times (queue_app/stages.py): where each probe's milliseconds went.
    stage_file = ctx.log_path(f"{log}-stages")
    stage_file.unlink(missing_ok=True)
    stage_env = {**(worker_env or {}), "JOBSITE_STAGE_TIMES": str(stage_file)}
    procs = spawn_workers(ctx, settings, db, log, burst=False, env=stage_env, extra=worker_extra)
    feeder = _Feeder(db, queue, load_per_s) if load_per_s else None
    ids: list[int] = []
    called: dict[int, float] = {}  # the clock just before each probe's enqueue call, the host's
    returned: dict[int, float] = {}  # when each probe's enqueue returned here (committed), the host's clock
    inserted: dict[int, float] = {}  # commit_apart: when its insert returned, before the COMMIT
    try:
        if not all(_wait_for_worker(proc) for proc in procs):
            raise RuntimeError(f"run_worker did not start:\n{log_tail(ctx.log_path(f'{log}-0'))}")
        time.sleep(0.5)  # let it reach its idle wait (LISTEN) before the first item
        if feeder:
            feeder.start()
            time.sleep(1.0)  # into the steady state
        for n in range(sizes.latency_samples):
            began = time.time()
            if commit_apart:
                with transaction.atomic(using=using):
                    item = engine.enqueue(PROBE_TASK, {"n": n}, queue=queue, using=using)
                    inserted[item.id] = time.time()
            else:
                item = engine.enqueue(PROBE_TASK, {"n": n}, queue=queue, using=using)
            returned[item.id], called[item.id] = time.time(), began
            ids.append(item.id)
            deadline = time.monotonic() + 10
            # The figure comes from the database's clocks, not from this wait; a query every millisecond from
            # here would take a good part of a core from the worker measured (2 cores), so look seldom.
            time.sleep(POLL_FIRST)
            while not _scalar("SELECT count(*) FROM queue_app_executionlog WHERE item_id = %(id)s", {"id": item.id}):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"item {item.id} did not start within 10 s ({where})")
                time.sleep(POLL_EVERY)
            time.sleep(0.02 if feeder else 0.05)  # idle again before the next one
    finally:
        if feeder:
            feeder.stop()
        stop(procs)
    # Where the time went, stage by stage to the handler's first line (stage_split.py): the database's times of
    # each probe joined with the workers' stamps. Through the views over the hot and history tables: the archiver
    # may have moved a probe by now.
    with connections[ALIAS].cursor() as cur:
        cur.execute(
            """SELECT i.id, (array_agg(l.reservation_id ORDER BY l.executed_at))[1], EXTRACT(EPOCH FROM i.created_at),
                      EXTRACT(EPOCH FROM min(r.reserved_at)), EXTRACT(EPOCH FROM min(l.executed_at))
               FROM queue_app_item_all i JOIN queue_app_executionlog l ON l.item_id = i.id
               JOIN queue_app_reservation_all r ON r.item_id = i.id
               WHERE i.id = ANY(%(ids)s) GROUP BY i.id, i.created_at""",
            {"ids": ids},
        )
        fetched = cur.fetchall()
    stages = stage_split.split(
        [
            (int(r), called[i], float(c), float(rv), float(e), returned[i], inserted.get(i))
            for i, r, c, rv, e in fetched
        ],
        stage_file,
    )
    if not stages.totals:
        raise RuntimeError(f"no probe has the workers' stage times ({where}): see {stage_file}")
    ms, to_lease, held = stages.totals, stages.to_lease, stages.lease_to_start()
    p50, p99 = percentile(ms, 0.50), percentile(ms, 0.99)
    ctx.progress(
        "jobsite",
        f"{where} enqueue-to-start over {len(ms)} items: p50 {p50:.2f} ms, p99 {p99:.2f} ms (to the lease p50 "
        f"{percentile(to_lease, 0.5):.2f} / p99 {percentile(to_lease, 0.99):.2f}, lease to start p50 "
        f"{percentile(held, 0.5):.2f} / p99 {percentile(held, 0.99):.2f})",
    )
    ctx.progress("jobsite", f"{where} split (ms): {stage_split.describe(stages)}")
    ctx.progress("jobsite", f"{where} the leases that took the probes: {stage_split.describe_leases(stages)}")
    detail = {
        "samples": len(ms),  # the probes stamped at every stage, of the `probes_sent`
        "probes_sent": len(ids),
        "mean_ms": round(statistics.fmean(ms), 3),
        "max_ms": round(max(ms), 3),
        **{
            f"{part}_{name}_ms": round(percentile(values, q), 3)
            for part, values in (("to_lease", to_lease), ("lease_to_start", held))
            for name, q in (("p50", 0.5), ("p99", 0.99))
        },
        **stage_split.detail(stages),
    }
    if feeder:
        detail.update(fed=feeder.fed, load_per_s=load_per_s)
    label = f"jobsite: enqueue-to-start {where}" if load_per_s else "jobsite: idle enqueue-to-start"
    note = f"load {share:.0%} of end-to-end" if load_per_s else ""
    return [
        Figure(f"jobsite.latency{suffix}_p50", f"{label} p50", p50, "ms", note, detail),
        Figure(f"jobsite.latency{suffix}_p99", f"{label} p99", p99, "ms", note, detail),
    ]


def measure_common_latency(ctx: BenchContext, sizes: Sizes, results: Results, per_s: float) -> list[Figure]:
    """jobsite's enqueue-to-start at the load every peer is measured at (peers.common_load), beside them, in a
    scratch database of its own, with the worker settings that won the end-to-end (without that figure, the
    grid's first)."""
    if not run_worker_available():
        return [Figure("latency.jobsite_p50", "jobsite p50", None, "ms", WORKER_MISSING)]
    e2e = results.figures.get("jobsite.e2e")
    chosen = (e2e.detail.get("worker_settings") if e2e else None) or sizes.e2e_grid[0]
    settings: WorkerSettings = tuple(chosen)
    with bench_database(ctx, "latency") as db:
        figures = measure_latency(ctx, sizes, db, settings, load_per_s=per_s, suffix="_common")
    return [
        replace(f, key=f"latency.jobsite_{q}", label=f"jobsite p{q[1:]}", note=describe(settings))
        for f, q in zip(figures, ("p50", "p99"), strict=True)
    ]


def measure_admin(ctx: BenchContext, sizes: Sizes, db: str, settings: WorkerSettings | None) -> list[Figure]:
    """The change list timed from its own process, while a worker drains a backlog when there is a worker."""
    queue = queue_settings.DEFAULT_QUEUE
    workers: list[subprocess.Popen] = []
    load = "under load" if settings else "no worker load"
    if settings:
        _clear_queue(queue)
        engine.enqueue_many(NOOP_TASK, [{} for _ in range(sizes.e2e_jobs)], queue=queue, using=ALIAS)
        workers += spawn_workers(ctx, settings, db, "jobsite-admin", burst=False)
    try:
        probe = subprocess.run(
            [sys.executable, "-m", "jobsite.bench.admin_probe", str(sizes.admin_requests)],
            env=django_child_env(db),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        stop(workers)
    lines = probe.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        out = {}
    label = f"jobsite: admin change list {load}"
    if "p50_ms" not in out:
        reason = out.get("error") or (probe.stderr.strip().splitlines() or ["no output"])[-1]
        ctx.progress("jobsite", f"admin change list: {reason}")
        return [Figure("jobsite.admin_p50", f"{label} p50", None, "ms", note=f"n/a ({reason[:60]})")]
    note = "" if out["statuses"] == {"200": sizes.admin_requests} else f"statuses {out['statuses']}"
    ctx.progress("jobsite", f"admin change list {load}: p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms")
    return [
        Figure("jobsite.admin_p50", f"{label} p50", out["p50_ms"], "ms", note=note, detail=out),
        Figure("jobsite.admin_p99", f"{label} p99", out["p99_ms"], "ms", note=note, detail=out),
    ]


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    with bench_database(ctx, "jobsite") as db:
        ctx.progress("jobsite", f"scratch database {db} migrated")
        results.add(measure_enqueue(ctx, sizes, db))
        settings = None
        if run_worker_available():
            figure, settings = measure_e2e(ctx, sizes, db)
            results.add(figure)
            ceiling.measure_again(ctx, sizes, results)  # when this run measured the ceiling: right after e2e
            results.add(measure_statement(ctx, sizes))
        else:
            ctx.progress("jobsite", "run_worker is not a command yet: end-to-end and latency are n/a")
            results.add(
                Figure("jobsite.e2e", "jobsite: end-to-end no-op, 1 run_worker", None, "jobs/s", WORKER_MISSING)
            )
        if settings:
            e2e = results.value("jobsite.e2e") or 0.0
            for suffix, share in LATENCY_LOADS:
                if share and not e2e:
                    continue  # no end-to-end figure: no load to take a share of
                try:
                    for figure in measure_latency(
                        ctx, sizes, db, settings, load_per_s=share * e2e, suffix=suffix, share=share
                    ):
                        results.add(figure)
                except RuntimeError as exc:
                    ctx.progress("jobsite", f"latency: {exc}")
                    key = f"jobsite.latency{suffix}_p50"
                    results.add(Figure(key, "jobsite: enqueue-to-start p50", None, "ms", "n/a (error)"))
        else:
            results.add(Figure("jobsite.latency_p50", "jobsite: idle enqueue-to-start p50", None, "ms", WORKER_MISSING))
            results.add(Figure("jobsite.latency_p99", "jobsite: idle enqueue-to-start p99", None, "ms", WORKER_MISSING))
        for figure in measure_admin(ctx, sizes, db, settings):
            results.add(figure)
