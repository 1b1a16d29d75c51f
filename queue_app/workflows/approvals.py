"""Approvals (issue 39): a human step (`wf.approval`, workflows/definition.py) waits for a user holding its
permission to approve or reject it. `decide` is the one state change, shared by the admin's "Pending approvals"
page (workflows/admin/approvals.py), `manage.py workflow approve|reject` and code: it settles the step's timeout
item while that is still ready, in one statement (workflows/sql.py, WORKFLOW_DECIDE_APPROVAL), so a second
decision, or one after the timeout was leased, changes nothing and raises NotWaiting saying why. Each decision
writes an admin LogEntry on the workflow, by the deciding user."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry

from ..engine.alias import atomic
from ..engine.db import cursor
from ..engine.payload import encode_json
from ..models import QueueItem
from . import sql
from .definition import WorkflowError
from .models import StepKind, StepState, Workflow, WorkflowStep

MAX_COMMENT = 2000


class ApprovalError(WorkflowError):
    """No such approval step, or a bad comment."""


class NotWaiting(ApprovalError):
    """The approval is not waiting for a decision (already decided, timed out, cancelled, not started yet)."""


class ApprovalDenied(ApprovalError, PermissionError):
    """The user does not hold the approval's permission (or is inactive)."""


@dataclass(frozen=True)
class Decision:
    step_id: int
    workflow_id: int
    step: str
    approved: bool
    by: str
    comment: str


def permission_of(step: WorkflowStep) -> str:
    return step.spec.get("permission", "")


def may_decide(user: Any, step: WorkflowStep) -> bool:
    """Whether `user` may decide the approval `step`: active and holding its permission (superusers hold all)."""
    return bool(user is not None and user.is_active and user.has_perm(permission_of(step)))


def refusal(user: Any, step: WorkflowStep) -> str:
    """Why `user` may not decide the approval `step` ("" when it may): inactive, or without its permission."""
    if may_decide(user, step):
        return ""
    who = f"{getattr(user, 'username', user)!r} may not decide step {step.name!r} of workflow {step.workflow_id}"
    if user is not None and not getattr(user, "is_active", False) and getattr(user, "is_authenticated", False):
        return f"{who}: the user is inactive"
    return f"{who}: it needs the permission {permission_of(step)!r}"


def pending(user: Any) -> list[WorkflowStep]:
    """The approvals waiting for a decision now (their workflow's current attempt, their timeout item not leased)
    that `user` may decide, oldest first; each with `workflow` loaded."""
    steps = (
        WorkflowStep.objects.filter(kind=StepKind.APPROVAL, state=StepState.QUEUED)
        .filter(item_id__in=QueueItem.objects.filter(state="ready").values("id"))
        .select_related("workflow")
        .order_by("ready_at", "id")
    )
    return [s for s in steps if s.attempt == s.workflow.attempt and may_decide(user, s)]


def find(workflow_id: int, step_name: str) -> WorkflowStep:
    """The approval step `step_name` of workflow `workflow_id`'s current attempt; ApprovalError when either is
    unknown or the step is not an approval."""
    workflow = Workflow.objects.filter(id=workflow_id).first()
    if workflow is None:
        raise ApprovalError(f"no workflow {workflow_id}")
    step = WorkflowStep.objects.filter(workflow_id=workflow.id, attempt=workflow.attempt, name=step_name).first()
    if step is None:
        raise ApprovalError(f"workflow {workflow_id} has no step {step_name!r}")
    if step.kind != StepKind.APPROVAL:
        article = "an" if step.kind[:1] in "aeiou" else "a"
        raise ApprovalError(
            f"step {step_name!r} of workflow {workflow_id} is {article} {step.kind} step, not an approval"
        )
    return step


def _why_not(step: WorkflowStep) -> str:
    step.refresh_from_db()
    workflow = Workflow.objects.get(id=step.workflow_id)
    what = f"step {step.name!r} of workflow {step.workflow_id} is not waiting for a decision"
    result = step.result if isinstance(step.result, dict) else {}
    if step.attempt != workflow.attempt:
        return f"{what}: it belongs to attempt {step.attempt}, the workflow is at attempt {workflow.attempt}"
    if result.get("approved") is True:
        return f"{what}: already approved by {result.get('by')}"
    if result.get("approved") is False:
        return f"{what}: already rejected by {result.get('by')}"
    if result.get("timed_out") or (step.state == StepState.FAILED and step.error):
        return f"{what}: it timed out ({step.state}{': ' + step.error if step.error else ''})"
    if step.state == StepState.QUEUED:
        return f"{what}: its timeout is being handled now"
    if step.state == StepState.WAITING:
        return f"{what}: the steps before it have not finished"
    return f"{what}: it is {step.state}"


def decide(step_id: int, user: Any, approve: bool, comment: str = "") -> Decision:
    """Approve (the step succeeds, result {"approved": True, "by": username, "comment"}) or reject (it fails with
    that result and the error "rejected by USER: COMMENT"; the workflow fails per its failure policy, running
    its compensations) the approval step `step_id`, as `user` (a Django user), with a LogEntry on the workflow.

    Raises, writing nothing: ApprovalError (no such approval step, a comment not a string or over 2,000
    characters), ApprovalDenied (the user lacks the step's permission or is inactive), NotWaiting (decided
    already, timed out, cancelled, not waiting yet: the message says which). Runs in the caller's transaction."""
    step = WorkflowStep.objects.filter(id=step_id, kind=StepKind.APPROVAL).first()
    if step is None:
        raise ApprovalError(f"no approval step {step_id}")
    comment = "" if comment is None else comment
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        raise ApprovalError(f"the comment must be text of at most {MAX_COMMENT} characters")
    refused = refusal(user, step)
    if refused:
        raise ApprovalDenied(refused)
    by = user.get_username()
    result = {"approved": bool(approve), "by": by, "comment": comment}
    error = "" if approve else f"rejected by {by}" + (f": {comment}" if comment else "")
    with atomic():
        with cursor() as cur:
            cur.execute(
                sql.WORKFLOW_DECIDE_APPROVAL,
                {"step_id": step.id, "approve": bool(approve), "result": encode_json(result, "result"), "error": error},
            )
            decided = cur.fetchone()
        if decided is None:
            raise NotWaiting(_why_not(step))
        verb = "Approved" if approve else "Rejected"
        LogEntry.objects.log_actions(
            user_id=user.pk,
            queryset=Workflow.objects.filter(pk=step.workflow_id),
            action_flag=CHANGE,
            change_message=f"{verb} step {step.name!r}" + (f": {comment}" if comment else ""),
        )
    return Decision(step.id, step.workflow_id, step.name, bool(approve), by, comment)
