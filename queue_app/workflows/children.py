"""Sub-workflows: a step (`wf.workflow(name, params, key=...)`) that starts another workflow, its child, and ends
with it. See docs/how-to/workflows.md, "Sub-workflows".

The step's item is its wait: a delayed item never due, like an approval's. When the step becomes ready, the
trigger workflow_child_start queues one start item (workflows/sql.py); its handler (start_child, transactional:
it commits with that item's settle) starts the child by its key, or finds the one the key names, and links it to
the step (WorkflowStep.child_workflow_id). The child's end settles the wait of every open step naming it, in the
transaction that ends the child (the trigger workflow_child_ended, queue_app_wf_child_settle): done with the
child's result, or dead when it failed or was cancelled; the settle trigger then ends the step and moves the
parent on like any step. A step cancelled while it waits (its workflow cancelled, failing, or past a deadline)
queues its child's cancel (the trigger workflow_child_cancel, cancel_child here).

Locks, in one order: a child's end takes the child's row, then the parent step's item, then the parent's row
(the settle trigger). A start that finds its child takes the child's row before the step's; one that makes the
child locks the step's row first (no other transaction knows the child yet). A parent's cancel never locks the
child: it queues the child's cancel, which takes the child's row in a transaction of its own.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..engine.db import cursor
from . import sql
from .definition import WorkflowError
from .models import StepKind, StepState, Workflow, WorkflowStartKey, WorkflowState, WorkflowStep


def child_key(step: WorkflowStep) -> str:
    """The key the step starts its child by: the declared one, else the parent's id and the step's name (the same
    in every attempt of the parent: a repair finds the child the earlier attempt started)."""
    return step.spec.get("key") or f"parent {step.workflow_id}/{step.name}"[:200]


def _fail_wait(step: WorkflowStep, error: str) -> None:
    """The child cannot start (its definition changed since: gone, or parameters it no longer takes): the step's
    wait settles dead with why, and the step fails (per its policy) through the settle trigger."""
    from ..models import QueueItem

    QueueItem.objects.filter(id=step.item_id, state="ready").update(
        state="dead", error=error[:2000], result=None, finished_at=_now(), updated_at=_now()
    )


def _now() -> Any:
    from django.db.models.functions import Now

    return Now()


def start_child(step_id: int) -> dict[str, Any]:
    """The start item's work (queue_app.workflow_start_child): start the step's child, or find it by its key, and
    link it, if the step is still waiting (else nothing: its workflow moved on). A child found failed or
    cancelled is repaired (a new attempt, its succeeded steps kept); one found succeeded ends the step now."""
    from . import services

    step = WorkflowStep.objects.filter(id=step_id, kind=StepKind.WORKFLOW).first()
    if step is None:
        return {"started": False, "why": "no such step"}
    name, key = step.spec["workflow"], child_key(step)
    with transaction.atomic():
        holder = WorkflowStartKey.objects.filter(name=name, key=key).values_list("workflow_id", flat=True).first()
        child = Workflow.objects.select_for_update().filter(id=holder).first() if holder else None
        step = WorkflowStep.objects.select_for_update().get(id=step_id)
        current = Workflow.objects.filter(id=step.workflow_id).values_list("attempt", flat=True).first()
        if step.state != StepState.QUEUED or step.attempt != current:
            return {"started": False, "why": f"step {step.name!r} is {step.state}"}
        created = False
        if child is None:
            try:
                child = services.start(
                    name, step.spec.get("params") or {}, key=key, started_by=f"workflow {step.workflow_id}"
                )
            except WorkflowError as exc:
                _fail_wait(step, f"child workflow {name!r} could not start: {exc}")
                return {"started": False, "why": str(exc)}
            created = bool(child.created)
            if not created:  # another start took the key meanwhile: its child, locked now
                child = Workflow.objects.select_for_update().get(id=child.id)
        WorkflowStep.objects.filter(id=step.id).update(child_workflow_id=child.id)
        if child.state == WorkflowState.SUCCEEDED:
            with cursor() as cur:
                cur.execute(sql.WORKFLOW_CHILD_SETTLE, {"child_id": child.id})
        elif child.state in (WorkflowState.FAILED, WorkflowState.CANCELLED):
            services.repair(child.id, actor=f"workflow {step.workflow_id} (step {step.name!r})")
    return {"child_workflow_id": child.id, "created": created}


def cancel_child(step_id: int) -> dict[str, Any]:
    """The cancel item's work (queue_app.workflow_cancel_child): the step was cancelled while it waited; its
    child is cancelled too, unless it has ended or another open step waits for it (a repair's new attempt, or
    another parent sharing its key)."""
    from . import services

    child_id = WorkflowStep.objects.filter(id=step_id).values_list("child_workflow_id", flat=True).first()
    if child_id is None:
        return {"cancelled": False, "why": "no child started"}
    if WorkflowStep.objects.filter(child_workflow_id=child_id, state=StepState.QUEUED).exists():
        return {"cancelled": False, "child_workflow_id": child_id, "why": "another step waits for it"}
    step = WorkflowStep.objects.get(id=step_id)
    done = services.cancel(child_id, actor=f"workflow {step.workflow_id} (step {step.name!r} cancelled)")
    return {"cancelled": done, "child_workflow_id": child_id}


# -- reading --------------------------------------------------------------------------------------------------


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
    current = Workflow.objects.filter(id=workflow_id).values_list("id", "name").first()
    if current is None:
        raise WorkflowError(f"no workflow {workflow_id}")
    for _ in range(limit):
        parent = parent_of(current[0])
        if parent is None:
            break
        current = (parent["workflow_id"], parent["name"])
    return current
