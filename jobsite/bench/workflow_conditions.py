"""The settle cost of conditions (issue 39), in the workflow part's scratch database, before its worker starts
(the test settles the items itself, in this process: no worker's speed in the figure).

One graph, with and without conditions: `first` -> N no-op steps -> `fan_in`. Without: the default rule
everywhere (the settle reads no rule). With: each of the N steps `run_if="all_done"` and the fan-in
`run_if="none_failed"`, so every one of them is decided by queue_app_wf_decide. Timed: the settle of `first`
(the transaction that makes N steps ready and, with conditions, decides them) and the one statement that
settles the N steps' items (counts the fan-in down and decides it). Best of ROUNDS, interleaved (which
variant goes first alternates); per step.
"""

import time

from django.db import connections

from queue_app import engine
from queue_app.conf import queue_settings

from .context import BenchContext
from .jobsite_side import ALIAS, NOOP_TASK, _clear_queue
from .report import Figure, Results
from .sizes import Sizes

ROUNDS = 5  # a freshly filled table's first settles run cold plans: 5 rounds, alternating which goes first


def _graph(n: int, conditional: bool):
    from queue_app.workflows.definition import Graph

    graph = Graph("bench conditions" if conditional else "bench plain")
    first = graph.task(NOOP_TASK, name="first")
    rule = {"run_if": "all_done"} if conditional else {}
    middle = [graph.task(NOOP_TASK, name=f"s{i}", after=[first], **rule) for i in range(n)]
    graph.task(NOOP_TASK, name="fan_in", after=middle, **({"run_if": "none_failed"} if conditional else {}))
    return graph


def _settle_times(n: int, conditional: bool, queue: str) -> tuple[float, float]:
    from queue_app.workflows.services import start_graph

    _clear_queue(queue)
    workflow = start_graph(_graph(n, conditional), started_by="queue_bench", using=ALIAS)
    [first] = engine.lease([queue], 1, "bench", 600, using=ALIAS)
    t0 = time.perf_counter()
    engine.complete(first, None, using=ALIAS)
    ready = time.perf_counter() - t0
    held = []
    while len(held) < n:
        held += engine.lease([queue], min(5_000, n - len(held)), "bench", 600, using=ALIAS)
    t0 = time.perf_counter()
    engine.complete_many([(lease, None) for lease in held], using=ALIAS)
    ended = time.perf_counter() - t0
    [fan_in] = engine.lease([queue], 1, "bench", 600, using=ALIAS)
    engine.complete(fan_in, None, using=ALIAS)
    with connections[ALIAS].cursor() as cur:
        cur.execute("SELECT state FROM queue_app_workflow WHERE id = %(id)s", {"id": workflow.id})
        state = cur.fetchone()[0]
    if state != "succeeded":
        raise RuntimeError(f"conditions bench: workflow {workflow.id} is {state}")
    return ready, ended


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    n = sizes.workflow_steps
    queue = queue_settings.DEFAULT_QUEUE
    best: dict[bool, list[float]] = {False: [float("inf")] * 2, True: [float("inf")] * 2}
    for round_ in range(ROUNDS):
        for conditional in (False, True) if round_ % 2 == 0 else (True, False):
            times = _settle_times(n, conditional, queue)
            best[conditional] = [min(a, b) for a, b in zip(best[conditional], times, strict=True)]
            ctx.progress(
                "workflow",
                f"round {round_ + 1}: {'with' if conditional else 'without'} conditions, {n:,} steps: first's "
                f"settle {times[0] * 1000:.1f} ms, the N steps' settle {times[1] * 1000:.1f} ms",
            )
    _clear_queue(queue)
    for key, label, index in (("ready", "settle making N steps ready", 0), ("ended", "settle of N steps", 1)):
        plain, cond = best[False][index] / n * 1000, best[True][index] / n * 1000
        results.add(Figure(f"workflow.{key}_plain_ms", f"{label}, per step, no conditions", plain, "ms"))
        results.add(
            Figure(
                f"workflow.{key}_conditions_ms",
                f"{label}, per step, every step conditional",
                cond,
                "ms",
                detail={"steps": n, "ratio": cond / plain, "rounds": ROUNDS},
            )
        )
    ctx.progress(
        "workflow",
        f"conditions: per step {best[True][0] / n * 1e3:.4f} vs {best[False][0] / n * 1e3:.4f} ms (ready), "
        f"{best[True][1] / n * 1e3:.4f} vs {best[False][1] / n * 1e3:.4f} ms (ended)",
    )
