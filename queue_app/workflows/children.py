"""Sub-workflows: a step (`wf.workflow(name, params, key=...)`) that starts another workflow, its child, and ends
with it. See docs/how-to/workflows.md, "Sub-workflows".

The step's item is its wait: a delayed item never due, like an approval's. A step with nothing to wait for when
its workflow starts starts its child in that transaction (services._start_children): the child made by its key,
the step's row written linked to it (WorkflowStep.child_workflow_id), so no start item is queued. Any other step
(one made ready later by a settle, a repair's copy, or one whose start in the parent's transaction did not make a
child: its key held by another workflow, its definition not loaded there, nested too deep) queues one start item
when it becomes ready, by the trigger workflow_child_start (workflows/sql.py); its handler (start_child,
transactional: it commits with that item's settle) starts the child by its key, or finds the one the key names,
and links it to the step. The child's end settles the wait of every open step naming it, in the
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

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from .models import StepKind, Workflow, WorkflowStep

# Sub-workflows nested deeper than this fail their step: a definition that starts itself through others (A starts B,
# B starts A) would otherwise start children without end (a workflow naming itself is refused when it is built).
MAX_DEPTH = 20

# How deep the workflow being written now is (0: a top-level start): a child started in its parent's start
# transaction has no link to read its depth from yet (services._start_children, child_steps.start_child set it).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("jobsite_workflow_depth", default=0)


def writing_depth() -> int:
    """The depth of the workflow being written in this context (0 unless a parent is starting it)."""
    return _depth.get()


@contextlib.contextmanager
def writing_at(depth: int) -> Iterator[None]:
    """Write the workflows started inside at `depth` (a child's: its parent's plus one)."""
    token = _depth.set(depth)
    try:
        yield
    finally:
        _depth.reset(token)


def child_key(workflow_id: int, name: str, spec: dict[str, Any]) -> str:
    """The key a sub-workflow step starts its child by: the declared one, else the parent's id and the step's name
    (the same in every attempt of the parent: a repair finds the child the earlier attempt started)."""
    return spec.get("key") or f"parent {workflow_id}/{name}"[:200]


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


def root_of(workflow_id: int, *, limit: int = 50) -> tuple[int, str]:
    """The top of its parent chain: (id, name) of the first ancestor with no parent (itself when it has none)."""
    current = Workflow.objects.filter(id=workflow_id).values_list("id", "name").first() or (workflow_id, "")
    for _ in range(limit):
        parent = parent_of(current[0])
        if parent is None:
            break
        current = (parent["workflow_id"], parent["name"])
    return current
