"""A sub-workflow step's overhead against a task step's (issue 48), with the workflow part's worker: one-step
workflows started one after another, interleaved, each measured on the database's clock from its start
(created_at) to its end (finished_at): a task step (one queue_app.noop item), and a sub-workflow step whose child
is one noop step (its start item, the child, the child's item, and the child's end settling the step). Two
ratios: end to end (the sub-workflow one's whole time over the task one's), and the step's own overhead (its
whole time less its child's own, start to end: what the wrapping costs beyond the child's run) over the task
one's. The goal: the overhead at most 2x."""

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


def _one(kind: str, procs: list[Any]) -> tuple[float, float]:
    """(its whole time, its child's own) in ms; 0 for a task step's."""
    from queue_app.workflows.definition import Graph
    from queue_app.workflows.services import start_graph

    graph = Graph(f"bench {kind} step")
    if kind == "task":
        graph.task("queue_app.noop", name="step")
    else:
        graph.workflow("bench.child", name="step")
    workflow_id = start_graph(graph, started_by="queue_bench", using=ALIAS).id
    wait_until(lambda: _scalar(STATE, {"id": workflow_id}) == "succeeded", 60, f"{kind}-step workflow", procs)
    child = float(_scalar(CHILD_ELAPSED, {"id": workflow_id})) * 1000 if kind == "workflow" else 0.0
    return float(_scalar(ELAPSED, {"id": workflow_id})) * 1000, child


def run(ctx: BenchContext, sizes: Sizes, results: Results, procs: list[Any]) -> None:
    samples = max(5, sizes.workflow_delay_samples)
    task_ms, child_ms, overhead_ms = [], [], []
    for _ in range(samples):
        task_ms.append(_one("task", procs)[0])
        whole, own = _one("workflow", procs)
        child_ms.append(whole)
        overhead_ms.append(whole - own)
    task, child, overhead = (statistics.median(v) for v in (task_ms, child_ms, overhead_ms))
    detail = {"samples": samples, "task_ms": task_ms, "sub_workflow_ms": child_ms, "overhead_ms": overhead_ms}
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
    ctx.progress(
        "workflow",
        f"sub-workflow step {child:.1f} ms vs task step {task:.1f} ms (medians of {samples}) = {child / task:.2f}x "
        f"end to end; its overhead less its child's run {overhead:.1f} ms = {overhead / task:.2f}x",
    )
