"""A sub-workflow step's overhead against a task step's (issue 48), with the workflow part's worker: one-step
workflows started one after another, interleaved, each measured on the database's clock from its start
(created_at) to its end (finished_at): a task step (one queue_app.noop item), and a sub-workflow step whose child
is one noop step (its start item, the child, the child's item, and the child's end settling the step). The goal:
the sub-workflow workflow at most 2x the task one."""

from __future__ import annotations

import statistics
from typing import Any

from .context import BenchContext, wait_until
from .jobsite_side import ALIAS, _scalar
from .report import Figure, Results
from .sizes import Sizes

ELAPSED = "SELECT extract(epoch FROM finished_at - created_at) FROM queue_app_workflow WHERE id = %(id)s"
STATE = "SELECT state FROM queue_app_workflow WHERE id = %(id)s"


def _one(kind: str, procs: list[Any]) -> float:
    from queue_app.workflows.definition import Graph
    from queue_app.workflows.services import start_graph

    graph = Graph(f"bench {kind} step")
    if kind == "task":
        graph.task("queue_app.noop", name="step")
    else:
        graph.workflow("bench.child", name="step")
    workflow_id = start_graph(graph, started_by="queue_bench", using=ALIAS).id
    wait_until(lambda: _scalar(STATE, {"id": workflow_id}) == "succeeded", 60, f"{kind}-step workflow", procs)
    return float(_scalar(ELAPSED, {"id": workflow_id})) * 1000


def run(ctx: BenchContext, sizes: Sizes, results: Results, procs: list[Any]) -> None:
    samples = max(5, sizes.workflow_delay_samples)
    task_ms, child_ms = [], []
    for _ in range(samples):
        task_ms.append(_one("task", procs))
        child_ms.append(_one("workflow", procs))
    task, child = statistics.median(task_ms), statistics.median(child_ms)
    detail = {"samples": samples, "task_ms": task_ms, "sub_workflow_ms": child_ms}
    results.add(Figure("workflow.task_step_wf_ms", "one-step workflow, a task step (median)", task, "ms"))
    results.add(
        Figure(
            "workflow.sub_workflow_step_ms",
            "one-step workflow, a sub-workflow step (median; goal <= 2x the task step's)",
            child,
            "ms",
            detail=detail,
        )
    )
    ctx.progress(
        "workflow",
        f"sub-workflow step {child:.1f} ms vs task step {task:.1f} ms (medians of {samples}) = {child / task:.2f}x",
    )
