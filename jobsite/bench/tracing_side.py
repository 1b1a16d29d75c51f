"""queue_bench's tracing part (issue 40): the end-to-end no-op drain of one worker host with tracing off against
tracing on at 100 % and at 1 % sampling, exporting to a real OTLP/HTTP receiver on loopback (otlp_receiver.py) in
this process.

The comparison is made of pairs: an off drain and an on drain back to back (`Sizes.tracing_pairs` pairs for each
sampled variant, the order inside a pair alternating, so neither side always runs first on a table the other left
or in a load that rises), and the figure is the median of the pairs' ratios, printed with the load average at
each pair. The two drains of a pair are alike but for tracing: the same worker settings, the same environment
(the OTEL_* variables of the on side, with OTEL_TRACES_EXPORTER=none on the off side, which leaves tracing
unconfigured: jobsite's "off"), the same number of items written the same way (enqueued, then their
`trace_context` set by one UPDATE: NULL for off, as an untraced producer leaves it).

The items carry what a traced producer sampling with `parentbased_traceidratio` would have stored: each its own
trace, sampled (flags 01) for every item at 100 %, for one item in 100 at 1 % (flags 00 for the others); the
workers sample `parentbased_traceidratio` too, so an attempt follows its item's flag, as in a deployment where the
web processes and the workers share the OTEL_* settings. The producers' own cost is not in these figures (the bench
enqueues); the worker's is.

Beside the throughput, each drain's CPU time per item of the worker host (its processes' user + system time, from
the bench's RUSAGE_CHILDREN once they exited, less what a worker of the same side spends starting and stopping
with nothing to do; the server's is not in it): on a machine others load, a drain's rate moves with their load,
the CPU an item costs much less. Its ratios are medians over the pairs too.
"""

import os
import resource
import statistics
from collections.abc import Callable

from django.db import connections

from queue_app import engine
from queue_app.conf import queue_settings

from .context import BenchContext, django_child_env, drain, log_tail, spawn, stop
from .jobsite_side import ALIAS, NOOP_TASK, WorkerSettings, _clear_queue, _Remaining, bench_database, worker_args
from .otlp_receiver import Receiver
from .report import Figure, Results
from .sizes import Sizes

# (figure key suffix, label, one item in `every` sampled, or None for tracing off)
OFF = ("off", "tracing off", None)
SAMPLED = (("on_100", "tracing on, 100% sampled", 1), ("on_1", "tracing on, 1% sampled", 100))

# Each item its own trace (the producer's span id made up too); sampled when its id is a multiple of `every`.
_CONTEXTS = """
UPDATE queue_app_queueitem
SET trace_context = CASE WHEN %(every)s::int IS NOT NULL
    THEN '00-' || md5(random()::text) || '-' || left(md5(random()::text), 16)
         || CASE WHEN id %% %(every)s::int = 0 THEN '-01' ELSE '-00' END END
WHERE queue_id = %(queue)s
"""


def _settings(sizes: Sizes, results: Results) -> WorkerSettings:
    e2e = results.figures.get("jobsite.e2e")
    chosen = e2e.detail.get("worker_settings") if e2e is not None else None
    return tuple(chosen) if chosen else sizes.e2e_grid[0]


def _environment(receiver: Receiver, every: int | None) -> dict[str, str]:
    """The same variables on both sides of a pair; only the exporter switches tracing on or off."""
    return {
        "OTEL_TRACES_EXPORTER": "none" if every is None else "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "jobsite-bench-worker",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(1 / (every or 1)),
    }


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_of(start: Callable[[], list]) -> float:
    """CPU seconds (user + system) the processes `start()` returns used, once they exited."""
    before = _cpu_used()
    procs = start()
    try:
        for proc in procs:
            proc.wait(120)
    finally:
        stop(procs)
    return _cpu_used() - before


def _load() -> str:
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    receiver = Receiver(keep=False)
    settings = _settings(sizes, results)
    queue = queue_settings.DEFAULT_QUEUE
    jobs = sizes.e2e_jobs
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    spans: dict[str, int] = {}
    loads: list[str] = [_load()]
    try:
        with bench_database(ctx, "tracing") as db:

            def workers(every: int | None, log: str) -> list:
                env = django_child_env(db, **_environment(receiver, every))
                args = worker_args(settings, burst=True)
                return [spawn(args, env=env, log=ctx.log_path(f"{log}-{n}")) for n in range(settings[0])]

            _clear_queue(queue)
            # A worker host of each side started and stopped with nothing to do: its fixed cost, taken off each
            # drain's CPU.
            fixed = {every: _cpu_of(lambda e=every: workers(e, f"tracing-idle-{e}")) for every in (None, 1)}

            def one(key: str, label: str, every: int | None, tag: str) -> tuple[float, float] | None:
                _clear_queue(queue)
                engine.enqueue_many(NOOP_TASK, [{} for _ in range(jobs)], queue=queue, using=ALIAS)
                with connections[ALIAS].cursor() as cur:
                    cur.execute(_CONTEXTS, {"every": every, "queue": queue})
                    cur.execute("VACUUM ANALYZE queue_app_queueitem")
                received = receiver.count()
                before = _cpu_used()
                procs = workers(every, f"tracing-{tag}")
                try:
                    result = drain(_Remaining(queue, jobs), jobs, procs, timeout=sizes.drain_timeout)
                    for proc in procs:
                        proc.wait(30)  # its last spans flushed at exit
                finally:
                    stop(procs)
                if not result.complete:
                    tail = log_tail(ctx.log_path(f"tracing-{tag}-0"), 8)
                    ctx.progress("tracing", f"{label}: the drain did not finish\n{tail}")
                    return None
                used = (_cpu_used() - before - fixed[None if every is None else 1]) / jobs * 1e6
                spans[key] = receiver.count() - received
                rates.setdefault(key, []).append(result.steady_per_s)
                cpus.setdefault(key, []).append(used)
                return result.steady_per_s, used

            for pair in range(sizes.tracing_pairs):
                for index, (key, label, every) in enumerate(SAMPLED):
                    sides = [(*OFF, "off"), (key, label, every, "on")]
                    if (pair + index) % 2:
                        sides.reverse()
                    got = {side: one(k, lb, ev, f"{pair}-{key}-{side}") for k, lb, ev, side in sides}
                    loads.append(_load())
                    if got["off"] is None or got["on"] is None:
                        continue
                    (off_rate, off_cpu), (on_rate, on_cpu) = got["off"], got["on"]
                    ratios.setdefault(key, []).append(on_rate / off_rate)
                    # A drain too short to stand out of the workers' fixed cost (the smoke sizes): no CPU ratio.
                    cpu_ratio = on_cpu / off_cpu if off_cpu > 0 and on_cpu > 0 else None
                    if cpu_ratio is not None:
                        cpu_ratios.setdefault(key, []).append(cpu_ratio)
                    first = sides[0][3]
                    ctx.progress(
                        "tracing",
                        f"pair {pair + 1} ({first} first), load {loads[-1]}: off {off_rate:,.0f} jobs/s"
                        f" {off_cpu:,.0f} us/item, {label} {on_rate:,.0f} jobs/s {on_cpu:,.0f} us/item,"
                        f" {spans[key]:,} spans received: ratio {on_rate / off_rate:.2f}, CPU "
                        + ("n/a" if cpu_ratio is None else f"x{cpu_ratio:.2f}"),
                    )
    finally:
        receiver.stop()
    note = "settings {} x {} c={} b={} p={}; loopback OTLP/HTTP receiver".format(*settings)
    detail_all = {"pairs": sizes.tracing_pairs, "loads": loads}

    def median(values: list[float] | None) -> float | None:
        return statistics.median(values) if values else None

    for key, label, _ in (OFF, *SAMPLED):
        detail = {**detail_all, "spans_received_last_round": spans.get(key, 0), "rates": rates.get(key, [])}
        value = median(rates.get(key))
        results.add(Figure(f"tracing.{key}", f"end-to-end no-op, {label} (median)", value, "jobs/s", note, detail))
        cpu_label = f"worker CPU an item, {label} (median)"
        results.add(Figure(f"tracing.cpu_{key}", cpu_label, median(cpus.get(key)), "us", "worker host's user + system"))
    for key, label, _ in SAMPLED:
        suffix = key.removeprefix("on_")
        results.add(
            Figure(
                f"tracing.ratio_{suffix}",
                f"{label} / off, median of pairs",
                median(ratios.get(key)),
                "x",
                f"loads {loads[0]} .. {loads[-1]}",
                {"ratios": [round(r, 3) for r in ratios.get(key, [])], **detail_all},
            )
        )
        results.add(
            Figure(
                f"tracing.cpu_ratio_{suffix}",
                f"worker CPU an item, {label} / off, median of pairs",
                median(cpu_ratios.get(key)),
                "x",
                "",
                {"ratios": [round(r, 3) for r in cpu_ratios.get(key, [])]},
            )
        )
