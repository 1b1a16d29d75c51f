"""The floor of an idle start on this machine: what the shortest LISTEN/NOTIFY path costs on bare PostgreSQL.

An item enqueued on an idle queue wakes several processes in turn, each asleep since the item before: the
enqueuing backend (which also waits for the WAL flush), the listening backend, the worker's loop, the leasing
backend, the worker again. On a small VM each wake-up of a process idle for tens of milliseconds costs a few
tenths of a millisecond that a back-to-back loop never shows. These figures measure that floor with nothing of
jobsite's: one process, bare psycopg, a one-index table, each step timed after the pause the bench's idle
probes leave between items (`PAUSE`):

- `ceiling.idle_round_trip`: `SELECT 1` on a connection idle for the pause (back to back in its detail);
- `ceiling.idle_commit`: one durable enqueue, `INSERT` + `pg_notify` in autocommit (`synchronous_commit` on);
- `ceiling.idle_start`: that enqueue, the notification read on a second connection, then a lease of one row
  (`UPDATE ... FOR UPDATE SKIP LOCKED RETURNING`) on a third: the clock before the INSERT to the lease's rows
  in hand. Its stages are in its detail. It hands to no thread and runs no handler: a queue's idle
  enqueue-to-start cannot be below it on this machine.
"""

import select
import time
from collections.abc import Callable

import psycopg

from .context import BenchContext
from .report import Figure, Results, percentile
from .sizes import Sizes

PAUSE = 0.05  # seconds between probes: the bench's idle probes leave as much (jobsite_side.measure_latency)
TABLE = "bench_idle_floor"
CHANNEL = "bench_idle_floor"
CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, payload jsonb NOT NULL DEFAULT '{{}}',"
    " state text NOT NULL DEFAULT 'ready')",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_ready ON {TABLE} (id) WHERE state = 'ready'",
)
ENQUEUE = f"WITH j AS (INSERT INTO {TABLE} (payload) VALUES ('{{}}')) SELECT pg_notify('{CHANNEL}', '')"
LEASE = f"""UPDATE {TABLE} SET state = 'reserved'
WHERE id IN (SELECT id FROM {TABLE} WHERE state = 'ready' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload"""
ROUND_TRIP = "SELECT 1"


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 0.5), 3), "p99_ms": round(percentile(values, 0.99), 3)}


def _timed(run: Callable[[], None], samples: int, pause: float) -> list[float]:
    """`run`'s milliseconds, each after `pause` seconds of sleep (none: back to back)."""
    out = []
    for _ in range(samples):
        if pause:
            time.sleep(pause)
        began = time.perf_counter()
        run()
        out.append((time.perf_counter() - began) * 1000)
    return out


def measure(connect: Callable[[], psycopg.Connection], samples: int, pause: float = PAUSE) -> list[Figure]:
    """The three figures; `connect()` opens an autocommit connection to a scratch database."""
    with connect() as enqueuer, connect() as listener, connect() as leaser:
        for statement in CREATE:
            enqueuer.execute(statement, prepare=False)
        listener.execute(f"LISTEN {CHANNEL}")

        def round_trip() -> None:
            leaser.execute(ROUND_TRIP).fetchone()

        def commit() -> None:
            enqueuer.execute(ENQUEUE).fetchone()

        _timed(round_trip, 10, 0)  # prepared, caches filled
        back_to_back = _timed(round_trip, samples, 0)
        idle = _timed(round_trip, samples, pause)
        commits_back_to_back = _timed(commit, samples, 0)
        commits = _timed(commit, samples, pause)
        for _ in listener.notifies(timeout=0):
            pass
        leaser.execute(f"UPDATE {TABLE} SET state = 'done' WHERE state = 'ready'", prepare=False)
        stages: dict[str, list[float]] = {"commit": [], "notify": [], "lease": []}
        totals = []
        for _ in range(samples):
            time.sleep(pause)
            began = time.perf_counter()
            enqueuer.execute(ENQUEUE).fetchone()
            committed = time.perf_counter()
            while not select.select([listener.fileno()], [], [], 5.0)[0] or not list(listener.notifies(timeout=0)):
                if time.perf_counter() - committed > 5.0:
                    raise RuntimeError("the notification did not arrive within 5 s")
            woken = time.perf_counter()
            if not leaser.execute(LEASE).fetchall():
                raise RuntimeError("the lease found no ready row after its notification")
            leased = time.perf_counter()
            stages["commit"].append((committed - began) * 1000)
            stages["notify"].append((woken - committed) * 1000)
            stages["lease"].append((leased - woken) * 1000)
            totals.append((leased - began) * 1000)
        leaser.execute(f"DROP TABLE {TABLE}", prepare=False)
    pause_ms = f"after {pause * 1000:.0f} ms idle"
    return [
        _step("ceiling.idle_round_trip", f"floor: SELECT 1 round trip {pause_ms}, p50", idle, back_to_back),
        _step("ceiling.idle_commit", f"floor: durable INSERT + NOTIFY {pause_ms}, p50", commits, commits_back_to_back),
        Figure(
            "ceiling.idle_start",
            f"floor: enqueue to lease in hand {pause_ms} (bare psycopg), p50",
            round(percentile(totals, 0.5), 3),
            "ms",
            note="; ".join(f"{name} {percentile(v, 0.5):.2f}" for name, v in stages.items())
            + f"; p99 {percentile(totals, 0.99):.2f}",
            detail={"total": _ms(totals), **{name: _ms(v) for name, v in stages.items()}, "samples": samples},
        ),
    ]


def _step(key: str, label: str, idle: list[float], back_to_back: list[float]) -> Figure:
    """One step's p50 after the pause, its back-to-back p50 beside it."""
    return Figure(
        key,
        label,
        round(percentile(idle, 0.5), 3),
        "ms",
        note=f"back to back {percentile(back_to_back, 0.5):.2f} ms",
        detail={"idle": _ms(idle), "back_to_back": _ms(back_to_back), "samples": len(idle)},
    )


def run(ctx: BenchContext, sizes: Sizes, results: Results, db: str) -> None:
    samples = max(40, sizes.latency_samples)
    # Prepared from the first run, as every statement on the hot path of the systems measured beside it.
    for figure in measure(lambda: ctx.server.connect(db, prepare_threshold=0), samples):
        results.add(figure)
        ctx.progress("ceiling", f"{figure.label}: {figure.value:.2f} ms ({figure.note})")
