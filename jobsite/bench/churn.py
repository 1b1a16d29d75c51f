"""`queue_bench --churn`: does the queue stay small under steady churn? One `run_worker` works while this process
enqueues no-ops at a steady rate for `--churn-minutes`; the default queue keeps done items for RETENTION only,
so the worker's maintenance (archive, prune, vacuum) has to keep up. The size of the queue's hot tables and
of its history (every partition of both history tables), with their indexes and TOAST, is sampled throughout;
the goal is end <= 1.1x start, where "start" is taken after a warm-up long enough for pruning to have begun (an
empty table at t=0 would make any ratio meaningless). A queue keeping a minute keeps a minute of history: its
archived rows go row by row (engine/history.py), not with their day.
"""

import time
from datetime import timedelta

from django.db import connections

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.models import Queue

from .context import BenchContext, django_child_env, log_tail, spawn, stop
from .jobsite_side import ALIAS, NOOP_TASK, WORKER_MISSING, bench_database, run_worker_available, worker_args
from .report import Figure, Results

TABLES = ("queue_app_queueitem", "queue_app_reservation", "queue_app_deadletter", "queue_app_dedupclaim")
RATE = 1_400  # default items enqueued per second, in ticks of TICK seconds: about 5 million an hour
TICK = 0.1
RETENTION = timedelta(seconds=60)
WORKER_SETTINGS = (1, "thread", 16, 500, 100)  # (processes, pool, concurrency, batch, prefetch)


HISTORY_TABLES = ("queue_app_itemhistory", "queue_app_reservationhistory")


def queue_bytes() -> tuple[int, int]:
    """(hot tables, history partitions), bytes with indexes and TOAST."""
    with connections[ALIAS].cursor() as cur:
        cur.execute(
            "SELECT (SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%(t)s::text[]) AS t),"
            " (SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0) FROM unnest(%(h)s::text[]) AS h,"
            "  pg_partition_tree(h::regclass) AS p WHERE p.isleaf)",
            {"t": list(TABLES), "h": list(HISTORY_TABLES)},
        )
        hot, history = cur.fetchone()
        return int(hot), int(history)


def open_items() -> int:
    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT count(*) FROM queue_app_queueitem WHERE state IN ('ready', 'reserved')")
        return int(cur.fetchone()[0])


def run(ctx: BenchContext, results: Results, *, minutes: float, rate: int = RATE) -> None:
    labels = {
        "churn.size_start": "churn: hot tables + indexes after warm-up",
        "churn.size_end": f"churn: hot tables + indexes after {minutes:g} min",
        "churn.history_start": "churn: history partitions after warm-up",
        "churn.history_end": f"churn: history partitions after {minutes:g} min",
        "churn.growth": "churn: size end / start (hot + history)",
    }
    if not run_worker_available():
        ctx.progress("churn", "run_worker is not a command yet: churn is n/a")
        results.add(Figure("churn.growth", labels["churn.growth"], None, "x", note=WORKER_MISSING))
        return
    duration = minutes * 60
    warmup = min(300.0, max(RETENTION.total_seconds() * 2, duration / 6), duration / 2)
    sample_every = max(5.0, duration / 120)
    with bench_database(ctx, "churn") as db:
        queue = queue_settings.DEFAULT_QUEUE
        engine.ensure_queue(queue, using=ALIAS)
        Queue.objects.using(ALIAS).filter(name=queue).update(retention=RETENTION)
        proc = spawn(worker_args(WORKER_SETTINGS, burst=False), env=django_child_env(db), log=ctx.log_path("churn"))
        series: list[tuple[float, int, int, int]] = []  # (seconds, hot bytes, history bytes, items not done)
        start_bytes = None
        enqueued = 0
        per_tick = max(1, round(rate * TICK))
        payloads = [{} for _ in range(per_tick)]
        t0 = time.monotonic()
        next_sample = 0.0
        try:
            while (now := time.monotonic() - t0) < duration:
                if proc.poll() is not None:
                    raise RuntimeError(f"run_worker exited ({proc.returncode}):\n{log_tail(ctx.log_path('churn'))}")
                engine.enqueue_many(NOOP_TASK, payloads, queue=queue, using=ALIAS)
                enqueued += per_tick
                if now >= next_sample:
                    (hot, history), backlog = queue_bytes(), open_items()
                    series.append((round(now, 1), hot, history, backlog))
                    if start_bytes is None and now >= warmup:
                        start_bytes = (hot, history)
                    ctx.progress(
                        "churn",
                        f"{now / 60:5.1f} min: {enqueued:,} queued, {backlog:,} open, hot {hot / 2**20:,.1f} MB, "
                        f"history {history / 2**20:,.1f} MB",
                    )
                    next_sample = now + sample_every
                time.sleep(max(0.0, TICK - (time.monotonic() - t0 - now)))
            end_bytes, end_backlog = queue_bytes(), open_items()
        except RuntimeError as exc:
            ctx.progress("churn", str(exc))
            results.add(Figure("churn.growth", labels["churn.growth"], None, "x", note="n/a (run_worker exited)"))
            return
        finally:
            stop([proc])
    start_bytes = start_bytes or series[0][1:3]
    growth = sum(end_bytes) / sum(start_bytes)
    detail = {
        "series": series,
        "enqueued": enqueued,
        "rate": rate,
        "retention_s": RETENTION.total_seconds(),
        "warmup_s": warmup,
        "not_done_at_end": end_backlog,
    }
    note = f"{rate:,}/s, {enqueued:,} items, retention {RETENTION}"
    if end_backlog > rate * 10:  # more than ten seconds behind: the size measures a backlog, not bloat
        note += f"; worker fell behind ({end_backlog:,} not done)"
    results.add(Figure("churn.size_start", labels["churn.size_start"], start_bytes[0] / 2**20, "MB"))
    results.add(Figure("churn.size_end", labels["churn.size_end"], end_bytes[0] / 2**20, "MB"))
    results.add(Figure("churn.history_start", labels["churn.history_start"], start_bytes[1] / 2**20, "MB"))
    results.add(Figure("churn.history_end", labels["churn.history_end"], end_bytes[1] / 2**20, "MB"))
    results.add(Figure("churn.growth", labels["churn.growth"], growth, "x", note=note, detail=detail))
