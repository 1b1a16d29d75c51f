"""Versions and forks of a workflow in the admin (issue 39): the versions page (the workflow's version against
another version of its definition, or the current definition: a table of the steps added, removed and changed,
and both graphs drawn as one by Graphviz, coloured by change), and the fork page (a form: the step to re-run from,
on the stored graph or the current definition; a POST with the start permission forks through
workflows.services.fork and writes a LogEntry on the new workflow)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.utils.safestring import mark_safe

from queue_app.workflows import WorkflowError, versions
from queue_app.workflows import services as workflows
from queue_app.workflows.graph import diff_svg
from queue_app.workflows.models import WORKFLOW_FINAL_STATES, StepKind, Workflow, WorkflowStep, WorkflowVersion

TEMPLATES = "admin/jobsite_workflows/workflow/"
CURRENT = "current"  # the `against` of the current definition (a version can be named anything else)


def _context(model_admin: Any, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "changelist_url": model_admin.reverse("changelist"),
        **extra,
    }


def versions_view(model_admin: Any, request: HttpRequest, workflow_id: int) -> HttpResponse:
    """GET ?against=VERSION (default: the current definition)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    workflow = get_object_or_404(Workflow, pk=workflow_id)
    known = list(WorkflowVersion.objects.filter(name=workflow.name).order_by("created_at"))
    shapes = {v.version: v.shape for v in known}
    against = request.GET.get("against") or CURRENT
    error, changes, graph = "", [], ""
    before = shapes.get(workflow.version)
    if before is None:
        error = (
            f"no shape is kept for version {workflow.version!r} of {workflow.name!r} (a backfill, a batch, or older)"
        )
    elif against == CURRENT:
        try:
            _, _, label, after = versions.current(workflow)
        except WorkflowError as exc:
            error, after, label = f"the current definition does not build: {exc}", None, ""
    else:
        after, label = shapes.get(against), against
        if after is None:
            error = f"no version {against!r} of {workflow.name!r}"
    if not error:
        changes = versions.diff(before, after)
        drawn = [(c.name, c.change, "; ".join(f"{f}: {b} -> {a}" for f, b, a in c.fields)) for c in changes]
        graph = mark_safe(diff_svg(drawn, versions.edges(before, after)))  # noqa: S308  dot's SVG, labels escaped
    context = _context(
        model_admin,
        request,
        f"{workflow.name} #{workflow.id}: versions",
        workflow=workflow,
        versions=known,
        against=against,
        against_label=label if not error else against,
        current=CURRENT,
        changes=changes,
        changed=[c for c in changes if c.change != "same"],
        graph=graph,
        error=error,
    )
    return TemplateResponse(request, TEMPLATES + "versions.html", context)


class ForkForm(forms.Form):
    step = forms.ChoiceField(help_text="It and everything downstream of it run again; the other steps keep results.")
    onto_current = forms.BooleanField(
        required=False,
        label="onto the current definition",
        help_text="Run the definition as the code has it now (default: the graph this workflow ran).",
    )

    def __init__(self, steps: list[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["step"].choices = [(s, s) for s in steps]


def fork_view(model_admin: Any, request: HttpRequest, workflow_id: int) -> HttpResponse:
    """GET: the form (view permission); POST: fork (the start permission), a LogEntry, then the new workflow."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    workflow = get_object_or_404(Workflow, pk=workflow_id)
    steps = list(
        WorkflowStep.objects.filter(workflow=workflow, attempt=workflow.attempt, parent=None)
        .exclude(kind=StepKind.COMPENSATION)
        .order_by("id")
        .values_list("name", flat=True)
    )
    form = ForkForm(steps, request.POST or None)
    status = 200
    if request.method == "POST":
        if not model_admin.has_start_permission(request):
            raise PermissionDenied
        if form.is_valid():
            step, onto = form.cleaned_data["step"], form.cleaned_data["onto_current"]
            try:
                forked = workflows.fork(workflow.id, step, onto_current=onto, actor=request.user.get_username())
            except WorkflowError as exc:
                form.add_error(None, str(exc))
            else:
                how = "the current definition" if onto else "the stored graph"
                LogEntry.objects.log_actions(
                    user_id=request.user.pk,
                    queryset=Workflow.objects.filter(pk=forked.pk),
                    action_flag=ADDITION,
                    change_message=f"Forked from #{workflow.id} at step {step!r} ({how})",
                )
                model_admin.message_user(
                    request, f"Forked {forked.name} #{forked.id} from #{workflow.id} at {step!r}", messages.SUCCESS
                )
                return HttpResponseRedirect(model_admin.reverse("change", forked.id))
        status = 400
    context = _context(
        model_admin,
        request,
        f"Fork {workflow.name} #{workflow.id}",
        workflow=workflow,
        form=form,
        finished=workflow.state in WORKFLOW_FINAL_STATES,
        may_start=model_admin.has_start_permission(request),
    )
    return TemplateResponse(request, TEMPLATES + "fork.html", context, status=status)
