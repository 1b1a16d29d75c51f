"""Flow control's figures (`queue_bench --only flow`), in a scratch database migrated like the real one:

- lease throughput: items/s through `engine.settle_and_lease` in this process (lease a batch, complete it with
  the next lease, until the queue is empty) on an unlimited queue, a fair queue (its items over ten group keys)
  and a queue with a rate limit too high to bind; best of two interleaved rounds each. The unlimited queue is
  leased by the many-queue statement; the others by the flow-controlled path (queue row lock, LEASE_FAIR).
- priority aging (issue 41): the same lease throughput on a queue whose items spread over AGING_LEVELS priorities,
  without aging (the many-queue statement) and with an aging rate (LEASE_AGED under the queue's row lock).
- debounce (issue 41): single enqueues per second, plain against debounced into DEBOUNCE_KEYS keys (each one an
  upsert on its key's ready item), in this process.
- chunked handlers (issue 41): end-to-end items/s of one `run_worker --burst` (threads) through no-op items,
  single (`queue_app.noop`) against chunks of 100 (`bench.chunk_noop`), from the first lease to the last finish.
- rate-limit accuracy: four `run_worker` processes on a queue limited to N leases per period; the leases per
  window over the three whole windows of the run, and their largest distance from N.
- fairness: a big and a small group key in a fair queue, two `run_worker --burst` processes; how many leases went
  out until the small key's last one, against its fair share (round robin between two keys: twice its items).
"""

import subprocess
import time
from collections.abc import Callable

from django.db import connections

from queue_app import engine

from .context import BenchContext, django_child_env, manage_args, spawn, stop
from .jobsite_side import ALIAS, NOOP_TASK, _scalar, bench_database, run_worker_available
from .report import Figure, Results
from .sizes import Sizes

LEASE_BATCH = 500
LEASE_ROUNDS = 2
FAIR_KEYS = 10
RATE_WORKERS = 4
FAIR_WORKERS, FAIR_BATCH = 2, 50
AGING_LEVELS = 5
DEBOUNCE_KEYS, DEBOUNCE_ENQUEUES = 100, 1_000
CHUNK_ITEMS, CHUNK_WORKER = 10_000, ("--concurrency", "4", "--prefetch", "200", "--batch", "200")


def _set_queue(queue: str, **columns: object) -> None:
    """The scratch queue's flow-control columns (the bench's own set-up; users go through services/queue_config)."""
    engine.ensure_queue(queue, using=ALIAS)
    assignments = ", ".join(f"{name} = %({name})s" for name in columns)
    with connections[ALIAS].cursor() as cur:
        cur.execute(f"UPDATE queue_app_queue SET {assignments} WHERE name = %(queue)s", {**columns, "queue": queue})


def _drain_in_process(queue: str) -> int:
    done: list[engine.Lease] = []
    leased = 0
    while True:
        out = engine.settle_and_lease([(h, None) for h in done], [queue], LEASE_BATCH, "bench", 600, using=ALIAS)
        done = out.leases
        leased += len(done)
        if not done:
            return leased


def _lease_rate(queue: str, items: int, keys: int | None, levels: int = 1) -> float:
    if keys is None:
        for level in range(levels):
            engine.enqueue_many(NOOP_TASK, [{}] * (items // levels), queue=queue, priority=level, using=ALIAS)
    else:
        for key in range(keys):
            engine.enqueue_many(NOOP_TASK, [{}] * (items // keys), queue=queue, group_key=f"k{key}", using=ALIAS)
    with connections[ALIAS].cursor() as cur:
        cur.execute("VACUUM ANALYZE queue_app_queueitem")
    t0 = time.perf_counter()
    leased = _drain_in_process(queue)
    return leased / (time.perf_counter() - t0)


def measure_lease(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    variants: dict[str, tuple[str, Callable[[], None], int | None, int]] = {
        "unlimited": ("flow_plain", lambda: engine.ensure_queue("flow_plain", using=ALIAS), None, 1),
        "fair": ("flow_fair", lambda: _set_queue("flow_fair", fair=True), FAIR_KEYS, 1),
        "rate": ("flow_rate_open", lambda: _set_queue("flow_rate_open", rate_limit=10**9, rate_period=1), None, 1),
        "priorities": ("flow_levels", lambda: engine.ensure_queue("flow_levels", using=ALIAS), None, AGING_LEVELS),
        "aging": ("flow_aging", lambda: _set_queue("flow_aging", aging_rate=1.0), None, AGING_LEVELS),
    }
    best: dict[str, float] = {}
    for _ in range(LEASE_ROUNDS):
        for name, (queue, prepare, keys, levels) in variants.items():
            prepare()
            rate = _lease_rate(queue, sizes.flow_lease_items, keys, levels)
            best[name] = max(best.get(name, 0.0), rate)
            ctx.progress("flow", f"lease+settle in process, {name} queue: {rate:,.0f} items/s")
    labels = {
        "unlimited": "flow: lease+settle, unlimited queue",
        "fair": f"flow: lease+settle, fair queue ({FAIR_KEYS} keys)",
        "rate": "flow: lease+settle, rate-limited queue (not binding)",
        "priorities": f"flow: lease+settle, {AGING_LEVELS} priorities, no aging",
        "aging": f"flow: lease+settle, {AGING_LEVELS} priorities, aging 1 point/s",
    }
    for name, label in labels.items():
        base = "priorities" if name == "aging" else "unlimited"
        ratio = best[name] / best[base]
        note = f"batch {LEASE_BATCH}, {sizes.flow_lease_items:,} items, one process"
        if name != base:
            note += f"; {ratio:.2f}x the {base} queue"
        results.add(Figure(f"flow.lease_{name}", label, best[name], "items/s", note=note))


def measure_debounce(ctx: BenchContext, results: Results) -> None:
    """Single enqueues per second in this process: plain, then debounced over DEBOUNCE_KEYS keys (the first of
    each key inserts, the others update its ready item); best of two interleaved rounds."""
    best: dict[str, float] = {}
    for round_ in range(LEASE_ROUNDS):
        for name in ("plain", "debounced"):
            t0 = time.perf_counter()
            for n in range(DEBOUNCE_ENQUEUES):
                options = {"debounce_key": f"k{n % DEBOUNCE_KEYS}", "debounce": 600.0} if name == "debounced" else {}
                engine.enqueue(NOOP_TASK, {"n": n}, queue=f"debounce_{name}_{round_}", using=ALIAS, **options)
            rate = DEBOUNCE_ENQUEUES / (time.perf_counter() - t0)
            best[name] = max(best.get(name, 0.0), rate)
            ctx.progress("flow", f"single enqueues, {name}: {rate:,.0f}/s")
    for name in ("plain", "debounced"):
        note = f"{DEBOUNCE_ENQUEUES:,} enqueues, one process, autocommit each"
        if name == "debounced":
            note += f", {DEBOUNCE_KEYS} keys; {best[name] / best['plain']:.2f}x plain"
        results.add(Figure(f"flow.enqueue_{name}", f"flow: single enqueues, {name}", best[name], "items/s", note=note))


def _leases_per_window(queue: str, period: int) -> dict[int, int]:
    # Hot and archived alike (the views of migration 0017): the workers' archiver moves a finished item and its
    # reservations to the history ARCHIVE_AFTER (60 s) after it finished, long before a 60 s period's windows end.
    with connections[ALIAS].cursor() as cur:
        cur.execute(
            """SELECT floor(extract(epoch FROM r.reserved_at) / %(p)s)::bigint, count(*)
               FROM queue_app_reservation_all r JOIN queue_app_item_all i ON i.id = r.item_id
               WHERE i.queue_id = %(q)s GROUP BY 1 ORDER BY 1""",
            {"p": period, "q": queue},
        )
        return dict(cur.fetchall())


def _workers(ctx: BenchContext, db: str, count: int, log: str, *args: str) -> list[subprocess.Popen]:
    argv = manage_args("run_worker", "--no-scheduler", "--pool", "thread", "--poll-interval", "0.2", *args)
    return [spawn(argv, env=django_child_env(db), log=ctx.log_path(f"{log}-{n}")) for n in range(count)]


def measure_rate(ctx: BenchContext, sizes: Sizes, db: str, results: Results) -> None:
    limit, period = sizes.flow_rate
    queue = "flow_rate"
    configured = subprocess.run(
        manage_args("queue_config", queue, "--rate-limit", f"{limit}/{period}s"),
        env=django_child_env(db),
        capture_output=True,
        text=True,
    )
    if configured.returncode != 0:
        raise RuntimeError(f"queue_config failed: {configured.stderr}")
    engine.enqueue_many(NOOP_TASK, [{}] * (limit * 8), queue=queue, using=ALIAS)
    procs = _workers(ctx, db, RATE_WORKERS, "flow-rate", "--concurrency", "4", "--queues", queue)
    deadline = time.monotonic() + period * 7 + 60
    try:
        while len(_leases_per_window(queue, period)) < 6 and time.monotonic() < deadline:
            time.sleep(min(1.0, period / 4))
    finally:
        stop(procs)
    windows = _leases_per_window(queue, period)
    if not windows:
        raise RuntimeError(f"no lease of queue {queue} seen in {period * 7 + 60} s (see the flow-rate-* logs)")
    whole = sorted(windows)[1:-1][:3]
    counts = [windows[w] for w in whole]
    error = max(abs(n - limit) for n in counts) if len(counts) == 3 else None
    ctx.progress("flow", f"rate limit {limit}/{period}s, {RATE_WORKERS} workers: leases per whole window {counts}")
    results.add(
        Figure(
            "flow.rate_error",
            f"flow: rate limit {limit}/{period}s across {RATE_WORKERS} workers, largest miss per window",
            error,
            "leases",
            note=f"whole windows: {counts}; most in any window: {max(windows.values())}",
            detail={"limit": limit, "period": period, "windows": counts, "most": max(windows.values())},
        )
    )


def measure_fairness(ctx: BenchContext, sizes: Sizes, db: str, results: Results) -> None:
    big, small = sizes.flow_fair
    queue = "flow_tenants"
    _set_queue(queue, fair=True)
    engine.enqueue_many(NOOP_TASK, [{}] * big, queue=queue, group_key="big", using=ALIAS)
    engine.enqueue_many(NOOP_TASK, [{}] * small, queue=queue, group_key="small", using=ALIAS)
    args = ("--burst", "--concurrency", "16", "--batch", str(FAIR_BATCH), "--queues", queue)
    procs = _workers(ctx, db, FAIR_WORKERS, "flow-fair", *args)
    try:
        for proc in procs:
            proc.wait(timeout=600)
    finally:
        stop(procs)
    position = _scalar(  # hot and archived alike, as in _leases_per_window
        """SELECT count(*) FROM queue_app_reservation_all r JOIN queue_app_item_all i ON i.id = r.item_id
           WHERE i.queue_id = %(q)s AND r.id <= (SELECT max(r2.id) FROM queue_app_reservation_all r2
                          JOIN queue_app_item_all i ON i.id = r2.item_id
                          WHERE i.queue_id = %(q)s AND i.group_key = 'small')""",
        {"q": queue},
    )
    share = position / (2 * small)
    ctx.progress("flow", f"fair: the small key's last item was lease {position:,} of {big + small:,}")
    results.add(
        Figure(
            "flow.fair_share",
            f"flow: leases until a {small:,}-item key is out beside a {big:,}-item key, over its fair share",
            share,
            "x",
            note=f"lease {position:,} of {big + small:,} ({position / FAIR_BATCH:.1f} batches of {FAIR_BATCH}); "
            "1.0 = strict turns",
            detail={"position": position, "big": big, "small": small, "batch": FAIR_BATCH},
        )
    )


def _e2e_rate(queue: str) -> float:
    """Items/s of the queue from its first lease to its last finish (hot and archived alike)."""
    seconds = _scalar(
        """SELECT extract(epoch FROM max(i.finished_at) - min(r.reserved_at)) FROM queue_app_item_all i
           JOIN queue_app_reservation_all r ON r.item_id = i.id WHERE i.queue_id = %(q)s""",
        {"q": queue},
    )
    return CHUNK_ITEMS / float(seconds)


def measure_chunks(ctx: BenchContext, db: str, results: Results) -> None:
    best: dict[str, float] = {}
    for round_ in range(LEASE_ROUNDS):
        for name, task in (("single", NOOP_TASK), ("chunked", "bench.chunk_noop")):
            queue = f"chunk_{name}_{round_}"
            engine.enqueue_many(task, [{}] * CHUNK_ITEMS, queue=queue, using=ALIAS)
            args = ("--burst", "--import", "jobsite.bench.chunk_tasks", "--queues", queue, *CHUNK_WORKER)
            (proc,) = _workers(ctx, db, 1, f"chunk-{name}-{round_}", *args)
            try:
                proc.wait(timeout=600)
            finally:
                stop([proc])
            rate = _e2e_rate(queue)
            best[name] = max(best.get(name, 0.0), rate)
            ctx.progress("flow", f"no-op items end to end, {name}: {rate:,.0f} items/s")
    for name in ("single", "chunked"):
        note = f"{CHUNK_ITEMS:,} items, one burst worker ({' '.join(CHUNK_WORKER)}, threads)"
        if name == "chunked":
            note += f", chunks of 100; {best[name] / best['single']:.2f}x single"
        results.add(
            Figure(f"flow.chunk_{name}", f"flow: no-op items end to end, {name}", best[name], "items/s", note=note)
        )


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    with bench_database(ctx, "flow") as db:
        measure_lease(ctx, sizes, results)
        measure_debounce(ctx, results)
        if not run_worker_available():
            return
        measure_chunks(ctx, db, results)
        measure_fairness(ctx, sizes, db, results)
        measure_rate(ctx, sizes, db, results)
