"""Deadlines (issue 39): per workflow and per step, a duration from its start or a time (`wf.deadline`,
workflows/definition.py; `services.start(..., deadline=...)`).

Each deadline is one delayed item of `queue_app.workflow_deadline`, due then, naming the workflow, its attempt
and (a step's) the step: a workflow's is queued by the transaction that starts (repairs, forks) it, a step's by
the trigger workflow_step_deadline in the transaction that makes the step ready (workflows/sql.py). No process
watches the clock. When the item runs, `passed` acts in one transaction under the workflow's row lock, and only
if what it names is still open (the same attempt, the step still queued): an item run twice, or one that comes
after the workflow ended, changes nothing.

Past a workflow's deadline, its waiting steps are cancelled, its queued and running steps' items cancelled (a
running task is asked to stop, a Spark run stopped), and the workflow fails: the compensations of its completed
steps run, as after any failure. Past a step's deadline, its item is cancelled (a wait stops waiting, a running
handler is asked to stop): the step ends cancelled, which fails the workflow per its failure policy.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import F

from .. import engine, services
from ..engine.alias import atomic
from ..engine.db import cursor
from . import sql
from .definition import DEADLINE_TASK, WorkflowDefinitionError, deadline_spec
from .models import StepState, Workflow, WorkflowState, WorkflowStep

ACTING_STATES = (WorkflowState.RUNNING, WorkflowState.FAILING)


def parse(value: Any, *, what: str = "workflow deadline") -> dict[str, Any] | None:
    """A deadline given to a start: seconds (a number or timedelta) or a time -> its spec; None -> None."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return deadline_spec(None, value, what=what)
    return deadline_spec(value, None, what=what)


def due(spec: dict[str, Any] | None, *, strict: bool = True) -> dt.datetime | None:
    """When a workflow deadline spec falls due from now: now + seconds, or its time. A time already past is an
    error when `strict` (a start), else no deadline (a repair or fork of a workflow whose time has passed)."""
    if spec is None:
        return None
    now = dt.datetime.now(dt.UTC)
    if "seconds" in spec:
        return now + dt.timedelta(seconds=spec["seconds"])
    at = dt.datetime.fromisoformat(spec["at"])
    if at <= now:
        if strict:
            raise WorkflowDefinitionError(f"workflow deadline: {spec['at']} is in the past")
        return None
    return at


def arm(workflow_id: int, attempt: int, at: dt.datetime | None, using: str | None = None) -> None:
    """Queue the deadline item of a workflow's attempt (in the caller's transaction), due `at`."""
    if at is not None:
        engine.enqueue(DEADLINE_TASK, {"workflow_id": workflow_id, "attempt": attempt}, run_at=at, using=using)


def passed(workflow_id: int, attempt: int, step_id: int | None = None) -> bool:
    """A deadline item ran: cancel what it covers if it is still open (see the module). True when it acted."""
    now = dt.datetime.now(dt.UTC)
    with atomic():
        workflow = Workflow.objects.select_for_update().filter(id=workflow_id).first()
        if workflow is None or workflow.attempt != attempt or workflow.state not in ACTING_STATES:
            return False
        current = WorkflowStep.objects.filter(workflow_id=workflow.id, attempt=workflow.attempt)
        if step_id is not None:
            step = current.filter(id=step_id, state=StepState.QUEUED).exclude(item_id=None).first()
            if step is None:
                return False
            services.cancel_items([step.item_id], actor=f"the deadline of step {step.name!r} ({now:%H:%M:%S} UTC)")
            return True
        why = f"the workflow's deadline passed ({now:%Y-%m-%d %H:%M:%S} UTC)"
        closed = current.filter(state=StepState.WAITING).update(
            state=StepState.CANCELLED, error=f"not run: {why}", finished_at=now
        )
        Workflow.objects.filter(id=workflow.id).update(
            state=WorkflowState.FAILING, steps_open=F("steps_open") - closed, error=why
        )
        items = list(current.filter(state=StepState.QUEUED).exclude(item_id=None).values_list("item_id", flat=True))
        services.cancel_items(items, actor="the workflow's deadline")  # each settles its step (the trigger)
        with cursor() as cur:
            cur.execute(sql.WORKFLOW_FINISH, {"workflow_id": workflow.id})  # compensations when nothing runs
    return True
