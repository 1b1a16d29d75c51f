"""The admin's "Pending approvals" (issue 39): the approval steps waiting for a decision that the user may decide
(those whose permission they hold; superusers all), each with approve / reject buttons and a comment field. GET
only lists; a POST decides one step through workflows.approvals.decide (the service the CLI uses: a LogEntry per
decision). The permission is checked again on the POST: a user without it gets 403 saying why, nothing changes,
and the refusal is one WARNING line on the jobsite.workflows logger."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.log import log_response
from django.views.defaults import permission_denied

from queue_app.workflows import approvals
from queue_app.workflows.models import StepKind, WorkflowStep

TEMPLATE = "admin/jobsite_workflows/workflow/approvals.html"
logger = logging.getLogger("jobsite.workflows")


def pending_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """The list (GET) and one decision (POST: step, decision = approve | reject, comment)."""
    if request.method == "POST":
        return _decide(model_admin, request)
    rows = [
        {
            "step": step,
            "workflow": step.workflow,
            "workflow_url": model_admin.reverse("change", step.workflow_id),
            "permission": approvals.permission_of(step),
            "timeout": (step.args or {}).get("timeout"),
        }
        for step in approvals.pending(request.user)
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Pending approvals",
        "changelist_url": model_admin.reverse("changelist"),
        "rows": rows,
        "max_comment": approvals.MAX_COMMENT,
    }
    return TemplateResponse(request, TEMPLATE, context)


def _decide(model_admin: Any, request: HttpRequest) -> HttpResponse:
    back = HttpResponseRedirect(model_admin.reverse("approvals"))
    decision = request.POST.get("decision")
    try:
        step_id = int(request.POST.get("step", ""))
    except ValueError:
        step_id = None
    step = WorkflowStep.objects.filter(id=step_id, kind=StepKind.APPROVAL).first() if step_id else None
    if step is None or decision not in ("approve", "reject"):
        model_admin.message_user(request, "No such approval, or no decision given: nothing changed.", messages.ERROR)
        return back
    refused = approvals.refusal(request.user, step)
    if refused:  # one line saying why, not the traceback Django's request logger adds to a raised PermissionDenied
        response = permission_denied(request, PermissionDenied(refused))
        log_response("approval refused: %s", refused, response=response, request=request, logger=logger)  # WARNING
        return response
    try:
        done = approvals.decide(step.id, request.user, decision == "approve", request.POST.get("comment", ""))
    except approvals.ApprovalError as exc:
        model_admin.message_user(request, f"{exc}: nothing changed.", messages.WARNING)
    else:
        verb = "Approved" if done.approved else "Rejected"
        model_admin.message_user(
            request, f"{verb} step {done.step!r} of {step.workflow.name} #{done.workflow_id}", messages.SUCCESS
        )
    return back
