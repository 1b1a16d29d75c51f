"""The `split` part: where an item's start latency goes, stage by stage (stage_split.py), with each pool (the
sizes' split_workers: 2 x thread c32 b500 p500 and a process pool), on an idle queue and under the steady load the
peers are compared at (split_load, 180 items/s). Each figure is the enqueue-to-start p50 and p99; its detail
holds each stage's p50, p99 and mean (the means add up to the total's), and the leases that took the probes (where
they ran, how many items they asked for and got)."""

from dataclasses import replace

from .context import BenchContext
from .jobsite_side import bench_database, describe, measure_latency, run_worker_available
from .report import Figure, Results
from .sizes import Sizes

WORKER_MISSING = "n/a (run_worker is not a command yet)"


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    if not run_worker_available():
        results.add(Figure("split.thread_idle_p50", "split: thread pool, idle p50", None, "ms", WORKER_MISSING))
        return
    with bench_database(ctx, "split") as db:
        for settings in sizes.split_workers:
            pool = settings[1]
            for where, load in (("idle", 0.0), ("load", sizes.split_load)):
                ctx.progress("split", f"{describe(settings)}, {where}")
                figures = measure_latency(ctx, sizes, db, settings, load_per_s=load, suffix="_split", commit_apart=True)
                label = f"split: {pool} pool, {'idle' if not load else f'{load:,.0f} items/s'}"
                for figure, q in zip(figures, ("p50", "p99"), strict=True):
                    results.add(
                        replace(figure, key=f"split.{pool}_{where}_{q}", label=f"{label} {q}", note=describe(settings))
                    )
