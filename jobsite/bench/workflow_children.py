"""A sub-workflow step's overhead against a task step's (issue 48), with the workflow part's worker: one-step
workflows started one after another, interleaved, each measured on the database's clock from its start
(created_at) to its end (finished_at): a task step (one queue_app.noop item), and a sub-workflow step whose child
is one noop step (its start item, the child, the child's item, and the child's end settling the step). Two
ratios: end to end (the sub-workflow one's whole time over the task one's), and the step's own overhead (its
whole time less its child's own, start to end: what the wrapping costs beyond the child's run) over the task
one's. The goal: the overhead at most 2x.

Such a step, the workflow's first, starts its child in the workflow's start transaction; one made ready later (by
its upstream's settle) starts it through a start item a worker leases. The same pair after a first noop step
measures that path (information, no goal): each timed from the first step's end (its finished_at) instead."""

from __future__ import annotations

import statistics
from typing import Any

from .context import BenchContext, wait_until
from .jobsite_side import ALIAS, _scalar
from .report import Figure, Results
from .sizes import Sizes

ELAPSED = "SELECT extract(epoch FROM finished_at - created_at) FROM queue_app_workflow WHERE id = %(id)s"
CHILD_ELAPSED = """
SELECT extract(epoch FROM c.finished_at - c.created_at) FROM queue_app_workflowstep s
JOIN queue_app_workflow c ON c.id = s.child_workflow_id WHERE s.workflow_id = %(id)s
"""
STATE = "SELECT state FROM queue_app_workflow WHERE id = %(id)s"
# From the end of the first step (the "after" pair) to the workflow's end.
ELAPSED_AFTER = """
SELECT extract(epoch FROM w.finished_at - s.finished_at) FROM queue_app_workflow w
JOIN queue_app_workflowstep s ON s.workflow_id = w.id AND s.name = 'first' WHERE w.id = %(id)s
"""


def _one(kind: str, procs: list[Any], *, after: bool = False) -> tuple[float, float]:
    """(its whole time, its child's own) in ms; 0 for a task step's. `after`: the step after a first noop step,
    timed from that one's end."""
    from queue_app.workflows.definition import Graph
    from queue_app.workflows.services import start_graph

    graph = Graph(f"bench {kind} step{' after a step' if after else ''}")
    first = [graph.task("queue_app.noop", name="first")] if after else []
    if kind == "task":
        graph.task("queue_app.noop", name="step", after=first)
    else:
        graph.workflow("bench.child", name="step", after=first)
    workflow_id = start_graph(graph, started_by="queue_bench", using=ALIAS).id
    wait_until(lambda: _scalar(STATE, {"id": workflow_id}) == "succeeded", 60, f"{kind}-step workflow", procs)
    child = float(_scalar(CHILD_ELAPSED, {"id": workflow_id})) * 1000 if kind == "workflow" else 0.0
    return float(_scalar(ELAPSED_AFTER if after else ELAPSED, {"id": workflow_id})) * 1000, child


def run(ctx: BenchContext, sizes: Sizes, results: Results, procs: list[Any]) -> None:
    samples = max(5, sizes.workflow_delay_samples)
    task_ms, child_ms, overhead_ms = [], [], []
    task_after_ms, overhead_after_ms = [], []
    for _ in range(samples):
        task_ms.append(_one("task", procs)[0])
        whole, own = _one("workflow", procs)
        child_ms.append(whole)
        overhead_ms.append(whole - own)
        task_after_ms.append(_one("task", procs, after=True)[0])
        whole, own = _one("workflow", procs, after=True)
        overhead_after_ms.append(whole - own)
    task, child, overhead = (statistics.median(v) for v in (task_ms, child_ms, overhead_ms))
    task_after, overhead_after = statistics.median(task_after_ms), statistics.median(overhead_after_ms)
    detail = {
        "samples": samples,
        "task_ms": task_ms,
        "sub_workflow_ms": child_ms,
        "overhead_ms": overhead_ms,
        "task_after_ms": task_after_ms,
        "overhead_after_ms": overhead_after_ms,
    }
    results.add(Figure("workflow.task_step_wf_ms", "one-step workflow, a task step (median)", task, "ms"))
    results.add(
        Figure(
            "workflow.sub_workflow_step_ms",
            "one-step workflow, a sub-workflow step (median, end to end)",
            child,
            "ms",
            detail=detail,
        )
    )
    results.add(
        Figure(
            "workflow.sub_workflow_overhead_ms",
            "sub-workflow step's overhead, less its child's run (median; goal <= 2x the task step's)",
            overhead,
            "ms",
        )
    )
    results.add(
        Figure(
            "workflow.task_step_after_ms",
            "a task step after a first step, from that one's end (median)",
            task_after,
            "ms",
        )
    )
    results.add(
        Figure(
            "workflow.sub_workflow_after_overhead_ms",
            "a sub-workflow step after a first step (its start item), its overhead less its child's run (median)",
            overhead_after,
            "ms",
        )
    )
    ctx.progress(
        "workflow",
        f"sub-workflow step {child:.1f} ms vs task step {task:.1f} ms (medians of {samples}) = {child / task:.2f}x "
        f"end to end; its overhead less its child's run {overhead:.1f} ms = {overhead / task:.2f}x; after a first "
        f"step (a start item): {overhead_after:.1f} ms vs {task_after:.1f} ms = {overhead_after / task_after:.2f}x",
    )
