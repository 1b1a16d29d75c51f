"""queue_bench's tracing part (issue 40): the end-to-end no-op drain of one worker host with tracing off, then on
at 100 % and at 1 % sampling, exporting to a real OTLP/HTTP receiver on loopback (otlp_receiver.py) in this
process, in one run, so the ratios compare like with like. Each variant drains the same backlog with the same
worker settings (the jobsite part's winner when it ran, else the quick grid's first); the variants take turns
(`Sizes.tracing_rounds` rounds) and each keeps its best drain.

The items are enqueued untraced, so each attempt's span is a root the sampler decides on
(`OTEL_TRACES_SAMPLER=traceidratio`): what the workers pay per item with tracing on is measured, not the enqueue.
"""

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


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    receiver = Receiver(keep=False)
    try:
        with bench_database(ctx, "tracing") as db:
            settings = _settings(sizes, results)
            queue = queue_settings.DEFAULT_QUEUE
            jobs = sizes.e2e_jobs
            best: dict[str, float] = {}
            spans: dict[str, int] = {}
            for round_ in range(sizes.tracing_rounds):
                for key, label, ratio in VARIANTS:
                    _clear_queue(queue)
                    engine.enqueue_many(NOOP_TASK, [{} for _ in range(jobs)], queue=queue, using=ALIAS)
                    received = receiver.count()
                    log = ctx.log_path(f"tracing-{key}-{round_}")
                    env = django_child_env(db, **_environment(receiver, ratio))
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
                    spans[key] = receiver.count() - received
                    best[key] = max(best.get(key, 0.0), result.steady_per_s)
                    ctx.progress(
                        "tracing",
                        f"{label}: {jobs:,} jobs at {result.steady_per_s:,.0f} jobs/s, {spans[key]:,} spans received",
                    )
    finally:
        receiver.stop()
    note = "settings {} x {} c={} b={} p={}; loopback OTLP/HTTP receiver".format(*settings)
    for key, label, _ in VARIANTS:
        detail = {"spans_received_last_round": spans.get(key), "rounds": sizes.tracing_rounds}
        results.add(Figure(f"tracing.{key}", f"end-to-end no-op, {label}", best.get(key), "jobs/s", note, detail))
