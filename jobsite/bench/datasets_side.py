"""The datasets figures (`queue_bench --only datasets`), in a scratch database of their own, one worker host:

- trigger delay: partitions whose two upstreams (bench_a, bench_b) are recorded by worker items, the second
  after the first has settled; the `all` consumer's item is queued in the transaction that records the second,
  so the delay from "last upstream materialized" to "consumer queued" is that recording transaction's time
  (measured by the recording item: record_materialization with the trigger, p50/p99) against the same record of
  a dataset without consumers;
- mapped trigger delay: bench_daily recorded day after day; its consumer reads the last 7 days (a mapping naming 7
  upstream partitions), so from the 7th day on each record completes one window (and moves six more): that
  recording transaction's time, p50/p99 (goal: p99 at most 50 ms on an idle machine);
- settle overhead: N items that each record a materialization of a dataset with no consumer, against N plain
  noop items, interleaved rounds, the best of each: seconds per item (the settle with datasets vs without).
"""

import datetime as dt
import functools
import time

from django.db import connections

from queue_app import engine
from queue_app.conf import queue_settings

from .context import BenchContext, django_child_env, log_tail, manage_args, spawn, stop, wait_until
from .dataset_tasks import record as _record  # noqa: F401  registers bench.ds_record here too
from .jobsite_side import ALIAS, NOOP_TASK, _clear_queue, _scalar, bench_database
from .report import Figure, Results, percentile
from .sizes import Sizes

WORKER = ("run_worker", "--pool", "thread", "--concurrency", "8", "--import", "jobsite.bench.dataset_tasks")
ROUNDS = 3
RECORD = "bench.ds_record"

RESULT_MS = "SELECT (result->>'ms')::float8 FROM queue_app_item_all WHERE id = %(id)s"
CONSUMERS = "SELECT count(*) FROM queue_app_item_all WHERE task = 'bench.ds_consume'"
WINDOWS = "SELECT count(*) FROM queue_app_item_all WHERE task = 'bench.ds_window'"
WINDOW = 7


_wait = functools.partial(wait_until, poll=0.005)  # its delays are milliseconds


def _done(item_id: int) -> bool:
    return _scalar("SELECT state FROM queue_app_item_all WHERE id = %(id)s", {"id": item_id}) == "done"


def _open(queue: str) -> int:
    return _scalar(
        "SELECT count(*) FROM queue_app_queueitem WHERE queue_id = %(q)s AND state IN ('ready', 'reserved')",
        {"q": queue},
    )


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    with bench_database(ctx, "datasets") as db:
        procs = [spawn(manage_args(*WORKER, "--no-scheduler"), env=django_child_env(db), log=ctx.log_path("ds-worker"))]
        queue = queue_settings.DEFAULT_QUEUE
        try:
            record_ms, bare_ms = [], []
            for i in range(sizes.workflow_delay_samples):
                day = (dt.date(2020, 1, 1) + dt.timedelta(days=i)).isoformat()
                first = engine.enqueue(RECORD, {"dataset": "bench_a", "partition": day}, queue=queue, using=ALIAS)
                _wait(lambda first=first: _done(first.id), 60, "first upstream", procs)
                last = engine.enqueue(RECORD, {"dataset": "bench_b", "partition": day}, queue=queue, using=ALIAS)
                bare = engine.enqueue(RECORD, {"dataset": "bench_plain", "partition": day}, queue=queue, using=ALIAS)
                _wait(lambda: not _open(queue), 60, "last upstream and consumer", procs)
                record_ms.append(float(_scalar(RESULT_MS, {"id": last.id})))
                bare_ms.append(float(_scalar(RESULT_MS, {"id": bare.id})))
            fired = _scalar(CONSUMERS)
            if fired != len(record_ms):
                raise RuntimeError(f"{fired} consumer items for {len(record_ms)} partitions")
            detail = {"samples": len(record_ms)}
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                results.add(
                    Figure(
                        f"datasets.trigger_{name}",
                        f"trigger delay {name} (last upstream materialized -> consumer queued, one transaction)",
                        percentile(record_ms, q),
                        "ms",
                        detail=detail,
                    )
                )
                results.add(
                    Figure(
                        f"datasets.record_{name}",
                        f"record without a consumer {name}",
                        percentile(bare_ms, q),
                        "ms",
                        detail=detail,
                    )  # fmt: skip
                )
            mapped_ms = []
            for i in range(WINDOW - 1 + sizes.workflow_delay_samples):
                day = (dt.date(2021, 1, 1) + dt.timedelta(days=i)).isoformat()
                item = engine.enqueue(RECORD, {"dataset": "bench_daily", "partition": day}, queue=queue, using=ALIAS)
                _wait(lambda: not _open(queue), 60, "mapped upstream and consumer", procs)
                if i >= WINDOW - 1:
                    mapped_ms.append(float(_scalar(RESULT_MS, {"id": item.id})))
            windows = _scalar(WINDOWS)
            if windows != len(mapped_ms):
                raise RuntimeError(f"{windows} window consumer items for {len(mapped_ms)} complete windows")
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                results.add(
                    Figure(
                        f"datasets.mapped_trigger_{name}",
                        f"trigger delay {name}, a mapping naming {WINDOW} upstream partitions (TimeWindow last 7)",
                        percentile(mapped_ms, q),
                        "ms",
                        detail={"samples": len(mapped_ms)},
                    )
                )
            ctx.progress(
                "datasets",
                f"mapped trigger delay (7 partitions) p50 {percentile(mapped_ms, 0.5):.2f} ms "
                f"p99 {percentile(mapped_ms, 0.99):.2f} ms",
            )
            n = sizes.workflow_steps
            plain_s, ds_s = [], []
            for round_ in range(ROUNDS):
                for side, task, payloads, out in (
                    ("plain", NOOP_TASK, [{} for _ in range(n)], plain_s),
                    ("datasets", RECORD, [{"dataset": "bench_plain", "partition": "2020-01-01"}] * n, ds_s),
                ):
                    _clear_queue(queue)
                    t0 = time.perf_counter()
                    engine.enqueue_many(task, payloads, queue=queue, using=ALIAS)
                    out.append(time.perf_counter() - t0 + _wait(lambda: not _open(queue), 600, side, procs))
                ctx.progress("datasets", f"round {round_ + 1}: {n:,} plain {plain_s[-1]:.2f}s, "
                             f"{n:,} recording {ds_s[-1]:.2f}s")  # fmt: skip
            per_plain, per_ds = min(plain_s) / n, min(ds_s) / n
            note = "1 x --pool thread --concurrency 8"
            results.add(Figure("datasets.plain_item_ms", "plain item (same run)", per_plain * 1000, "ms", note=note))
            results.add(
                Figure(
                    "datasets.record_item_ms",
                    "item recording a materialization",
                    per_ds * 1000,
                    "ms",
                    note=note,
                    detail={"plain_seconds": plain_s, "datasets_seconds": ds_s, "items": n},
                )
            )
            ctx.progress(
                "datasets",
                f"trigger delay p50 {percentile(record_ms, 0.5):.2f} ms p99 {percentile(record_ms, 0.99):.2f} ms; "
                f"without consumer p50 {percentile(bare_ms, 0.5):.2f} ms p99 {percentile(bare_ms, 0.99):.2f} ms; "
                f"per item {per_ds * 1000:.3f} ms recording vs {per_plain * 1000:.3f} ms plain "
                f"(+{(per_ds / per_plain - 1) * 100:.0f}%)",
            )
        except RuntimeError as exc:
            ctx.progress("datasets", f"{exc}\n{log_tail(ctx.log_path('ds-worker'))}")
            results.add(Figure("datasets.trigger_p99", "trigger delay p99", None, "ms", note=f"n/a ({exc})"))
        finally:
            stop(procs)
            connections[ALIAS].close()
