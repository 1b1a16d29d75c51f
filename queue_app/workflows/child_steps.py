"""What a sub-workflow step's start and cancel items do (their tasks: workflows/tasks.py); the design and the
order the locks are taken in: workflows/children.py."""

from __future__ import annotations

import json
from typing import Any

from django.db.models.functions import Now

from ..engine.alias import atomic, queue_connection
from ..engine.db import cursor
from . import children, services, sql
from .definition import get_workflow
from .models import StepState, Workflow, WorkflowState, WorkflowStep


def _fail_wait(item_id: int, error: str) -> None:
    """The child cannot start (its definition changed since: gone, or parameters it no longer takes): the step's
    wait settles dead with why, and the step fails (per its policy) through the settle trigger."""
    from ..models import QueueItem

    QueueItem.objects.filter(id=item_id, state="ready").update(
        state="dead", error=error[:2000], result=None, finished_at=Now(), updated_at=Now()
    )


class _CannotStart(Exception):
    """The child cannot start (why): the step's wait settles dead (_fail_wait)."""


def start_child(step_id: int, carried: dict[str, Any] | None = None) -> dict[str, Any]:
    """The start item's work (queue_app.workflow_start_child): start the step's child, or find it by its key, and
    link it, if the step is still waiting (else nothing: its workflow moved on). A child found failed or
    cancelled is repaired (a new attempt, its succeeded steps kept); one found succeeded ends the step now.

    `carried`: the item's payload, with the child's definition name and parameters (its step's spec): the child's
    graph is built first, and one statement (sql.WORKFLOW_CHILD_START_READ) then makes its queues, reads the
    step, its key's holder, its workflow's attempt and its depth, locks the step when no workflow holds its key
    and claims the key when the child is to be made here (the common case); a holder is locked first, then the
    step (children.py, the lock order). It runs in its item's transaction (transactional); the statement and the
    child's start in one savepoint, undone when the child cannot start (the step's wait then settles dead)."""
    from ..engine.enqueue import _queue_defaults  # sql.ENSURE_QUEUE's row, as engine.ensure_queue makes it

    limit, prepared, failed = children.MAX_DEPTH, None, None
    if carried is not None and "workflow" in carried:  # an item queued before 0046 carries only the step's id
        try:
            prepared = services.prepare(get_workflow(carried["workflow"]), carried.get("params") or {})
        except Exception as exc:  # noqa: BLE001  (its builder's bug included: the step fails, never hangs)
            failed = exc
    queues = services.queues_of(prepared) if prepared is not None else []
    params = {"step_id": step_id, "limit": limit, "queues": queues, "claim": prepared is not None}
    item_id = None
    with atomic(savepoint=False):
        try:
            with atomic():
                # Django's cursor, not the engine's prepared one: a handler thread's connection is often cold (the
                # pool's threads take items in turn), where preparing costs a round trip of its own.
                with queue_connection().cursor() as cur:
                    cur.execute(sql.WORKFLOW_CHILD_START_READ, params | _queue_defaults())
                    row = cur.fetchone()
                if row is None:
                    return {"started": False, "why": "no such step"}
                workflow_id, step_name, spec, item_id, key, holder, state, attempt, current, depth, claimed = row
                spec = json.loads(spec) if isinstance(spec, str) else spec  # jsonb: Django's loader leaves it text
                name, child = spec["workflow"], None
                if holder is not None:
                    child = Workflow.objects.select_for_update().filter(id=holder).first()
                    state, attempt = (
                        WorkflowStep.objects.select_for_update().values_list("state", "attempt").get(id=step_id)
                    )
                if state != StepState.QUEUED or attempt != current:
                    return {"started": False, "why": f"step {step_name!r} is {state}"}
                created = False
                if child is None and depth >= limit - 1:
                    raise _CannotStart(
                        f"child workflow {name!r} not started: sub-workflows nest at most {limit} deep", "too deep"
                    )
                if child is None:
                    child = _start(name, spec, prepared, failed, key, claimed, workflow_id, depth, bool(queues))
                    created = bool(child.created)
                    if not created:  # another start took the key meanwhile: its child, locked now
                        child = Workflow.objects.select_for_update().get(id=child.id)
                WorkflowStep.objects.filter(id=step_id).update(child_workflow_id=child.id)
                if child.state == WorkflowState.SUCCEEDED:
                    with cursor() as cur:
                        cur.execute(sql.WORKFLOW_CHILD_SETTLE, {"child_id": child.id})
                elif child.state in (WorkflowState.FAILED, WorkflowState.CANCELLED):
                    services.repair(child.id, actor=f"workflow {workflow_id} (step {step_name!r})")
        except _CannotStart as exc:  # the savepoint undone, the key's claim with it: the wait settles dead
            error, why = exc.args
            _fail_wait(item_id, error)
            return {"started": False, "why": why}
    return {"child_workflow_id": child.id, "created": created}


def _start(
    name: str,
    spec: dict[str, Any],
    prepared: services.Prepared | None,
    failed: Exception | None,
    key: str,
    claimed: int | None,
    workflow_id: int,
    depth: int,
    queues_ready: bool,
) -> Workflow:
    """Start the child (its key claimed for `claimed` already, unless None), or raise _CannotStart."""
    try:
        if failed is not None:
            raise failed
        if prepared is None:
            prepared = services.prepare(get_workflow(name), spec.get("params") or {})
        with children.writing_at(depth + 1):  # its own first sub-workflow steps start theirs inline
            return services.start_prepared(
                prepared,
                key=(key, None),
                started_by=f"workflow {workflow_id}",
                queues_ready=queues_ready,
                claimed=claimed,
            )
    except Exception as exc:  # noqa: BLE001  (its builder's bug included: the step fails, never hangs)
        raise _CannotStart(f"child workflow {name!r} could not start: {exc}", str(exc)) from exc


def cancel_child(step_id: int) -> dict[str, Any]:
    """The cancel item's work (queue_app.workflow_cancel_child): the step was cancelled while it waited; its
    child is cancelled too, unless it has ended or another open step waits for it (a repair's new attempt, or
    another parent sharing its key)."""
    child_id = WorkflowStep.objects.filter(id=step_id).values_list("child_workflow_id", flat=True).first()
    if child_id is None:
        return {"cancelled": False, "why": "no child started"}
    if WorkflowStep.objects.filter(child_workflow_id=child_id, state=StepState.QUEUED).exists():
        return {"cancelled": False, "child_workflow_id": child_id, "why": "another step waits for it"}
    step = WorkflowStep.objects.get(id=step_id)
    done = services.cancel(child_id, actor=f"workflow {step.workflow_id} (step {step.name!r} cancelled)")
    return {"cancelled": done, "child_workflow_id": child_id}
