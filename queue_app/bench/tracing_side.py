"""queue_bench's tracing part (issue 40): the end-to-end no-op drain of one worker host with tracing off, then on
at 100 % and at 1 % sampling, exporting to a real OTLP/HTTP receiver on loopback (otlp_receiver.py) in this
process, in one run, so the ratios compare like with like. Each variant drains the same backlog with the same
worker settings (the jobsite part's winner when it ran, else the quick grid's first); the variants take turns
(`Sizes.tracing_rounds` rounds) and each keeps its best drain.

Beside the throughput, each variant's CPU time per item of the worker host (its processes' user + system time,
from the bench's RUSAGE_CHILDREN once they exited, less what a worker of the same variant spends starting and
stopping with nothing to do; the server's is not in it): on a machine others load, a drain's rate moves with
their load, the CPU an item costs much less.

The items are enqueued untraced, so each attempt's span is a root the sampler decides on
(`OTEL_TRACES_SAMPLER=traceidratio`): what the workers pay per item with tracing on is measured, not the enqueue.
"""

import resource
from collections.abc import Callable

from .. import engine
from ..conf import queue_settings
from .context import BenchContext, django_child_env, drain, log_tail, spawn, stop
from .jobsite_side import ALIAS, NOOP_TASK, WorkerSettings, _clear_queue, _Remaining, bench_database, worker_args
from .otlp_receiver import Receiver
from .report import Figure, Results
from .sizes import Sizes

# (figure key suffix, label, sampler argument or None for tracing off)
VARIANTS = (
    ("off", "tracing off", None),
    ("on_100", "tracing on, 100% sampled", "1.0"),
    ("on_1", "tracing on, 1% sampled", "0.01"),
)


def _settings(sizes: Sizes, results: Results) -> WorkerSettings:
    e2e = results.figures.get("jobsite.e2e")
    chosen = e2e.detail.get("worker_settings") if e2e is not None else None
    return tuple(chosen) if chosen else sizes.e2e_grid[0]


def _environment(receiver: Receiver, ratio: str | None) -> dict[str, str]:
    if ratio is None:
        return {"OTEL_TRACES_EXPORTER": "none"}
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "jobsite-bench-worker",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": ratio,
    }


def _cpu_of(start: Callable[[], list]) -> float:
    """CPU seconds (user + system) the processes `start()` returns used, once they exited."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = start()
    try:
        for proc in procs:
            proc.wait(120)
    finally:
        stop(procs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    receiver = Receiver(keep=False)
    try:
        with bench_database(ctx, "tracing") as db:
            settings = _settings(sizes, results)
            queue = queue_settings.DEFAULT_QUEUE
            jobs = sizes.e2e_jobs
            best: dict[str, float] = {}
            cpu: dict[str, float] = {}  # the least CPU microseconds an item of the worker host
            spans: dict[str, int] = {}
            _clear_queue(queue)
            fixed = {  # a worker of each variant started and stopped with nothing to do
                key: _cpu_of(
                    lambda ratio=ratio, key=key: [
                        spawn(
                            worker_args(settings, burst=True),
                            env=django_child_env(db, **_environment(receiver, ratio)),
                            log=ctx.log_path(f"tracing-{key}-idle"),
                        )
                        for _ in range(settings[0])
                    ]
                )
                for key, _, ratio in VARIANTS
            }
            for round_ in range(sizes.tracing_rounds):
                for key, label, ratio in VARIANTS:
                    _clear_queue(queue)
                    engine.enqueue_many(NOOP_TASK, [{} for _ in range(jobs)], queue=queue, using=ALIAS)
                    received = receiver.count()
                    log = ctx.log_path(f"tracing-{key}-{round_}")
                    env = django_child_env(db, **_environment(receiver, ratio))
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    procs = [spawn(worker_args(settings, burst=True), env=env, log=log) for _ in range(settings[0])]
                    try:
                        result = drain(_Remaining(queue, jobs), jobs, procs, timeout=sizes.drain_timeout)
                        for proc in procs:
                            proc.wait(30)  # its last spans flushed at exit
                    finally:
                        stop(procs)
                    if not result.complete:
                        ctx.progress("tracing", f"{label}: the drain did not finish\n{log_tail(log, 8)}")
                        continue
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - fixed[key]
                    spans[key] = receiver.count() - received
                    best[key] = max(best.get(key, 0.0), result.steady_per_s)
                    cpu[key] = min(cpu.get(key, float("inf")), used / jobs * 1e6)
                    ctx.progress(
                        "tracing",
                        f"{label}: {jobs:,} jobs at {result.steady_per_s:,.0f} jobs/s, {used / jobs * 1e6:,.0f} us"
                        f" of worker CPU an item, {spans[key]:,} spans received",
                    )
    finally:
        receiver.stop()
    note = "settings {} x {} c={} b={} p={}; loopback OTLP/HTTP receiver".format(*settings)
    for key, label, _ in VARIANTS:
        detail = {"spans_received_last_round": spans.get(key), "rounds": sizes.tracing_rounds}
        results.add(Figure(f"tracing.{key}", f"end-to-end no-op, {label}", best.get(key), "jobs/s", note, detail))
        cpu_label = f"worker CPU an item, {label}"
        results.add(Figure(f"tracing.cpu_{key}", cpu_label, cpu.get(key), "us", "worker host's user + system time"))
