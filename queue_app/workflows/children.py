"""Sub-workflows: a step (`wf.workflow(name, params, key=...)`) that starts another workflow, its child, and ends
with it. See docs/how-to/workflows.md, "Sub-workflows".

The step's item is its wait: a delayed item never due, like an approval's. When the step becomes ready, the
trigger workflow_child_start queues one start item (workflows/sql.py); its handler (start_child, transactional:
it commits with that item's settle) starts the child by its key, or finds the one the key names, and links it to
the step (WorkflowStep.child_workflow_id). The child's end settles the wait of every open step naming it, in the
transaction that ends the child (the trigger workflow_child_ended, queue_app_wf_child_settle): done with the
child's result, or dead when it failed or was cancelled; the settle trigger then ends the step and moves the
parent on like any step. A step cancelled while it waits (its workflow cancelled, failing, or past a deadline)
queues its child's cancel (the trigger workflow_child_cancel, child_steps.cancel_child).

This module reads the links (parent, children, root: what status, the admin and OpenLineage show); what the start
and cancel items do is in workflows/child_steps.py.

Locks, in one order: a child's end takes the child's row, then the parent step's item, then the parent's row
(the settle trigger). A start that finds its child takes the child's row before the step's; one that makes the
child locks the step's row first (no other transaction knows the child yet). A parent's cancel never locks the
child: it queues the child's cancel, which takes the child's row in a transaction of its own.
"""

from __future__ import annotations

from typing import Any

from .models import StepKind, Workflow, WorkflowStep

# -- the links --------------------------------------------------------------------------------------------------


def parent_of(workflow_id: int) -> dict[str, Any] | None:
    """The step that started (or last waited for) this workflow: {"workflow_id", "name", "step", "attempt"}."""
    step = (
        WorkflowStep.objects.filter(child_workflow_id=workflow_id, kind=StepKind.WORKFLOW)
        .order_by("-id")
        .values("workflow_id", "name", "attempt")
        .first()
    )
    if step is None:
        return None
    name = Workflow.objects.filter(id=step["workflow_id"]).values_list("name", flat=True).first()
    return {"workflow_id": step["workflow_id"], "name": name, "step": step["name"], "attempt": step["attempt"]}


def children_of(workflow: Workflow) -> list[dict[str, Any]]:
    """The children of its current attempt's sub-workflow steps: {"step", "workflow_id", "name", "state"}."""
    steps = list(
        WorkflowStep.objects.filter(
            workflow_id=workflow.id, attempt=workflow.attempt, kind=StepKind.WORKFLOW, child_workflow_id__isnull=False
        )
        .order_by("id")
        .values_list("name", "child_workflow_id", "target")
    )
    states = dict(Workflow.objects.filter(id__in=[c for _, c, _ in steps]).values_list("id", "state"))
    return [{"step": s, "workflow_id": c, "name": t, "state": states.get(c)} for s, c, t in steps]


def depth_of(workflow_id: int, *, limit: int) -> int:
    """How many ancestors the workflow has (0 for a top-level one), counting up to `limit`."""
    depth, current = 0, workflow_id
    while depth < limit and (parent := parent_of(current)) is not None:
        depth, current = depth + 1, parent["workflow_id"]
    return depth


def root_of(workflow_id: int, *, limit: int = 50) -> tuple[int, str]:
    """The top of its parent chain: (id, name) of the first ancestor with no parent (itself when it has none)."""
    current = Workflow.objects.filter(id=workflow_id).values_list("id", "name").first() or (workflow_id, "")
    for _ in range(limit):
        parent = parent_of(current[0])
        if parent is None:
            break
        current = (parent["workflow_id"], parent["name"])
    return current
