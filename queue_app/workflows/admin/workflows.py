"""Workflows in the admin: the list (state, steps done/total as a progress bar, duration, started by), a
workflow's page (its graph drawn by Graphviz, a backfill's partitions as a grid, the steps table), and the
permissioned actions: start (a form per registered workflow, from its declared parameters), backfill (job, range,
concurrency, parameters; a confirmation page says how many partitions), cancel and repair (a confirmation page
each, and bulk from the list), and the pending approvals (workflows/admin/approvals.py). Every change goes through
queue_app/workflows/services.py (approvals.py for a decision) and writes a LogEntry.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from queue_app.admin.actions import Operation, ReadOnlyAdmin
from queue_app.admin.display import cut, time_column
from queue_app.admin.overview import age
from queue_app.engine.alias import atomic
from queue_app.hooks import why_held
from queue_app.spark.forms import param_field
from queue_app.workflows import WorkflowError, children, registered_workflows
from queue_app.workflows import services as workflows
from queue_app.workflows.graph import COLOURS, SEVERITY, step_states, svg
from queue_app.workflows.models import WORKFLOW_FINAL_STATES, Workflow, WorkflowState, WorkflowStep

from . import approvals
from . import versions as workflow_versions

TEMPLATES = "admin/jobsite_workflows/workflow/"
PERMISSIONS = {
    "start": "jobsite_workflows.start_workflow",
    "cancel": "jobsite_workflows.cancel_workflow",
    "repair": "jobsite_workflows.repair_workflow",
    "repair-current": "jobsite_workflows.repair_workflow",
}
STEPS_PER_PAGE = 100
# The detail page's actions, each confirmed on a page of its own: (what the page asks, service, what is done).
DETAIL_ACTIONS = {
    "cancel": ("Cancel", workflows.cancel, "Cancelled"),
    "repair": ("Repair", workflows.repair, "Repaired (a new attempt)"),
    "repair-current": (
        "Repair onto the current definition",
        lambda pk, actor: workflows.repair(pk, actor=actor, onto_current=True),
        "Repaired onto the current definition (a new attempt)",
    ),
}


def _apply_each(service, pks: list[Any], actor: str) -> int:
    done = 0
    for pk in pks:
        try:
            done += bool(service(pk, actor=actor))
        except WorkflowError:
            continue
    return done


CANCEL = Operation(
    name="cancel_workflows",
    label="Cancel",
    done="Cancelled {n} {noun}",
    permission="cancel",
    eligible=lambda qs: qs.exclude(state__in=[*WORKFLOW_FINAL_STATES, WorkflowState.CANCELLING]),
    eligible_label="running, failing or compensating",
    apply=lambda pks, actor: _apply_each(workflows.cancel, pks, actor),
    bulk_button=True,
)
REPAIR = Operation(
    name="repair_workflows",
    label="Repair",
    done="Repaired {n} {noun} (a new attempt each)",
    permission="repair",
    eligible=lambda qs: qs.filter(state__in=[WorkflowState.FAILED, WorkflowState.CANCELLED]),
    eligible_label="failed or cancelled",
    apply=lambda pks, actor: _apply_each(workflows.repair, pks, actor),
)


def duration_of(workflow: Workflow) -> float:
    return ((workflow.finished_at or timezone.now()) - workflow.created_at).total_seconds()


class StartForm(forms.Form):
    """A registered workflow's parameters (prefixed by its name: every workflow's form fits on one page)."""

    def __init__(self, definition, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", definition.name)
        super().__init__(*args, **kwargs)
        self.definition = definition
        for param in definition.params:
            self.fields[param.name] = param_field(param)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if not self.errors:
            try:
                self.definition.validate({p.name: cleaned.get(p.name) for p in self.definition.params})
            except WorkflowError as exc:
                raise forms.ValidationError(str(exc)) from None
        return cleaned


class BackfillForm(forms.Form):
    job = forms.CharField(max_length=200, help_text="A workflow, Spark job or task with a date parameter.")
    start = forms.DateField(label="from", widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(label="to", widget=forms.DateInput(attrs={"type": "date"}), help_text="Included.")
    concurrency = forms.IntegerField(
        min_value=1, max_value=workflows.MAX_CONCURRENCY, initial=2, help_text="Partitions running at once, at most."
    )
    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Other parameters as a JSON object (the date parameter is the partition).",
    )
    force = forms.BooleanField(
        required=False, help_text=f"Allow more than {workflows.MAX_BACKFILL_PARTITIONS} partitions."
    )
    as_children = forms.BooleanField(
        required=False, label="as children", help_text="A workflow's days as child workflows of one parent."
    )

    def clean_params(self) -> dict[str, Any]:
        text = self.cleaned_data.get("params") or ""
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("must be a JSON object")
        return value


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyAdmin):
    operations = (CANCEL, REPAIR)
    actions = [op.as_action() for op in operations]
    # At 1,440 px the list fits its box (between the sidebar and the filters): the name and who started it are
    # cut, whole on hover; the start time is the lists' short one (list_time).
    list_display = (
        "id",
        "name_short",
        "kind",
        "state_badge",
        "progress",
        "duration",
        "started_by_short",
        "attempt",
        "created",
    )
    list_display_links = ("id", "name_short")
    list_filter = ("state", "kind")
    search_fields = ("=id", "=name")
    search_help_text = "Exact workflow id or name."
    list_per_page = 50

    # -- permissions ------------------------------------------------------------------------------------------

    def has_start_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["start"])

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["cancel"])

    def has_repair_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["repair"])

    # -- list columns -----------------------------------------------------------------------------------------

    @admin.display(description="state", ordering="state")
    def state_badge(self, workflow: Workflow) -> SafeString:
        return _badge(workflow.state)

    @admin.display(description="steps done")
    def progress(self, workflow: Workflow) -> SafeString:
        done = workflow.steps_total - workflow.steps_open
        return format_html(
            '<progress max="{}" value="{}" class="wf-progress"></progress> {}/{}',
            max(workflow.steps_total, 1),
            done,
            done,
            workflow.steps_total,
        )

    @admin.display(description="duration")
    def duration(self, workflow: Workflow) -> str:
        return age(duration_of(workflow))

    @admin.display(description="name", ordering="name")
    def name_short(self, workflow: Workflow) -> SafeString | str:
        return cut(workflow.name)

    @admin.display(description="started by", ordering="started_by")
    def started_by_short(self, workflow: Workflow) -> SafeString | str:
        return cut(workflow.started_by, "narrow")

    created = time_column("created_at", "created at", ordering="created_at")

    # -- URLs and views ---------------------------------------------------------------------------------------

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("start/", view(self.start_view), name=self.url_name("start")),
            path("backfill/", view(self.backfill_view), name=self.url_name("backfill")),
            path("approvals/", view(self.approvals_view), name=self.url_name("approvals")),
            path("<int:workflow_id>/versions/", view(self.versions_view), name=self.url_name("versions")),
            path("<int:workflow_id>/fork/", view(self.fork_view), name=self.url_name("fork")),
            *(
                path(f"<int:workflow_id>/{action}/", view(self._confirm_view(action)), name=self.url_name(action))
                for action in DETAIL_ACTIONS
            ),
            *super().get_urls(),
        ]

    def reverse(self, suffix: str, *args: Any) -> str:
        return reverse(f"{self.admin_site.name}:{self.url_name(suffix)}", args=args)

    def object_tool_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        links = []
        if self.has_start_permission(request):
            links = [("Start a workflow", self.reverse("start")), ("Backfill", self.reverse("backfill"))]
        links.append(("Pending approvals", self.reverse("approvals")))
        return [*links, *super().object_tool_links(request)]

    def approvals_view(self, request: HttpRequest) -> HttpResponse:
        """Any staff user: the page lists only the approvals whose permission they hold (admin/approvals.py here)."""
        return approvals.pending_view(self, request)

    def versions_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        return workflow_versions.versions_view(self, request, workflow_id)

    def fork_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        return workflow_versions.fork_view(self, request, workflow_id)

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "changelist_url": self.reverse("changelist"),
            "may_start": self.has_start_permission(request),
            "may_cancel": self.has_cancel_permission(request),
            "may_repair": self.has_repair_permission(request),
            **extra,
        }

    def _log(self, request: HttpRequest, workflow: Workflow, flag: int, message: str) -> None:
        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=Workflow.objects.filter(pk=workflow.pk),
            action_flag=flag,
            change_message=message,
        )

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        if not self.has_view_permission(request) or request.method == "POST":
            raise PermissionDenied  # the page has no form of its own: its buttons lead to their own pages
        try:
            workflow = Workflow.objects.get(pk=int(object_id))
        except (ValueError, Workflow.DoesNotExist):
            raise Http404(f"no workflow {object_id!r}") from None
        steps = step_states(workflow)
        group = request.GET.get("group")
        rows = [(s, state) for s, state in steps if not group or s.group == group]
        page = Paginator(rows, STEPS_PER_PAGE).get_page(request.GET.get("page"))
        parked = why_held(s.item_id for s, state in page if state == "blocked")  # why each waits
        context = self._context(
            request,
            f"{workflow.name} #{workflow.id}",
            workflow=workflow,
            graph=mark_safe(svg(workflow, steps, self._step_link)),  # noqa: S308  dot's own SVG, labels escaped by it
            page=page,
            rows=[
                {
                    "step": s,
                    "state": state,
                    "badge": _badge(state),
                    "link": self._step_link(s),
                    "result": "" if s.result is None else json.dumps(s.result, default=str),
                    "blocked": parked.get(s.item_id, "") if state == "blocked" else "",
                }
                for s, state in page
            ],
            group=group,
            counts=_counts(steps),
            duration=age(duration_of(workflow)),
            partitions=_partitions(steps) if workflow.kind == "backfill" else None,
            attempts=list(range(1, workflow.attempt)),
            cancel_url=self.reverse("cancel", workflow.id),
            repair_url=self.reverse("repair", workflow.id),
            repair_current_url=self.reverse("repair-current", workflow.id),
            versions_url=self.reverse("versions", workflow.id),
            fork_url=self.reverse("fork", workflow.id),
            forked_from_url=self.reverse("change", workflow.forked_from) if workflow.forked_from else "",
            parent=(parent := children.parent_of(workflow.id)),
            parent_url=self.reverse("change", parent["workflow_id"]) if parent else "",
            children=[
                {**c, "url": self.reverse("change", c["workflow_id"]), "badge": _badge(c["state"] or "")}
                for c in children.children_of(workflow)
            ],
            can_fork=workflow.state in WORKFLOW_FINAL_STATES,
            can_cancel=workflow.state not in (*WORKFLOW_FINAL_STATES, WorkflowState.CANCELLING),
            can_repair=workflow.state in (WorkflowState.FAILED, WorkflowState.CANCELLED),
            colours=COLOURS,
        )
        return TemplateResponse(request, TEMPLATES + "detail.html", context)

    @staticmethod
    def _step_link(step: WorkflowStep) -> str:
        if step.child_workflow_id:  # a sub-workflow step: its child's page
            return reverse("admin:jobsite_workflows_workflow_change", args=[step.child_workflow_id])
        if step.spark_run_id:
            return reverse("admin:jobsite_spark_sparkrun_change", args=[step.spark_run_id])
        if step.item_id:
            return reverse("admin:queue_app_queueitem_change", args=[step.item_id])
        return ""

    def _confirm_view(self, action: str):
        """The detail page's confirmed action `action` (DETAIL_ACTIONS): GET asks, POST calls the service."""
        what, service, done = DETAIL_ACTIONS[action]

        def confirm(request: HttpRequest, workflow_id: int) -> HttpResponse:
            if not request.user.has_perm(PERMISSIONS[action]):
                raise PermissionDenied
            workflow = get_object_or_404(Workflow, pk=workflow_id)
            if request.method == "POST":
                try:
                    result = service(workflow.id, actor=request.user.get_username())
                except WorkflowError as exc:
                    self.message_user(request, str(exc), messages.ERROR)
                else:
                    if result:
                        self._log(request, workflow, CHANGE, done)
                        self.message_user(request, f"{done}: {workflow.name} #{workflow.id}", messages.SUCCESS)
                    else:
                        self.message_user(
                            request, f"{workflow.name} #{workflow.id} has already ended", messages.WARNING
                        )
                return HttpResponseRedirect(self.reverse("change", workflow.id))
            context = self._context(request, f"{what} {workflow.name} #{workflow.id}?", workflow=workflow, what=what)
            return TemplateResponse(request, TEMPLATES + "confirm.html", context)

        return confirm

    def start_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        chosen = request.POST.get("workflow") if request.method == "POST" else None
        entries, status = [], 200
        for definition in registered_workflows():
            bound = definition.name == chosen
            form = StartForm(definition, request.POST if bound else None)
            if bound:
                if not self.has_start_permission(request):
                    raise PermissionDenied
                if form.is_valid():
                    try:
                        started = workflows.start(
                            definition.name,
                            {p.name: form.cleaned_data.get(p.name) for p in definition.params},
                            started_by=request.user.get_username(),
                        )
                    except WorkflowError as exc:
                        form.add_error(None, str(exc))
                    else:
                        self._log(request, started, ADDITION, f"Started with {started.params}")
                        self.message_user(request, f"Started {started.name} #{started.id}", messages.SUCCESS)
                        return HttpResponseRedirect(self.reverse("change", started.id))
                status = 400
            entries.append({"definition": definition, "form": form, "open": bound})
        context = self._context(request, "Start a workflow", entries=entries)
        return TemplateResponse(request, TEMPLATES + "start.html", context, status=status)

    def backfill_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = BackfillForm(request.POST or None)
        confirm, status = None, 200
        if request.method == "POST":
            if not self.has_start_permission(request):
                raise PermissionDenied
            if form.is_valid():
                data = form.cleaned_data
                days = (data["end"] - data["start"]).days + 1
                if "_confirm" not in request.POST:
                    # Check everything a start would, without writing: then ask.
                    try:
                        _check_backfill(data)
                    except WorkflowError as exc:
                        form.add_error(None, str(exc))
                        status = 400
                    else:
                        confirm = {"days": days, "data": data}
                else:
                    try:
                        started = workflows.backfill(
                            data["job"],
                            data["start"],
                            data["end"],
                            params=data["params"],
                            concurrency=data["concurrency"],
                            force=data["force"],
                            started_by=request.user.get_username(),
                            as_children=data["as_children"],
                        )
                    except WorkflowError as exc:
                        form.add_error(None, str(exc))
                        status = 400
                    else:
                        self._log(request, started, ADDITION, f"Backfill {started.params}")
                        self.message_user(request, f"Started {started.name} #{started.id}", messages.SUCCESS)
                        return HttpResponseRedirect(self.reverse("change", started.id))
            else:
                status = 400
        context = self._context(request, "Backfill", form=form, confirm=confirm)
        return TemplateResponse(request, TEMPLATES + "backfill.html", context, status=status)


def _check_backfill(data: dict[str, Any]) -> None:
    """Everything `workflows.backfill` checks, in a transaction rolled back (nothing stays written)."""

    class _Checked(Exception):
        pass

    try:
        with atomic():
            workflows.backfill(
                data["job"],
                data["start"],
                data["end"],
                params=data["params"],
                concurrency=data["concurrency"],
                force=data["force"],
                as_children=data["as_children"],
            )
            raise _Checked
    except _Checked:
        return


def _badge(state: str) -> SafeString:
    fill, border = COLOURS.get(state, COLOURS["waiting"])
    return format_html(
        '<span class="wf-state state-{}" style="background:{};border:1px solid {};padding:0 .4em;border-radius:3px">'
        "{}</span>",
        state,
        fill,
        border,
        state,
    )


def _counts(steps: list[tuple[WorkflowStep, str]]) -> list[tuple[str, int, SafeString]]:
    counts: dict[str, int] = {}
    for _, state in steps:
        counts[state] = counts.get(state, 0) + 1
    return [(s, counts[s], _badge(s)) for s in SEVERITY if s in counts] + [
        (s, n, _badge(s)) for s, n in counts.items() if s not in SEVERITY
    ]


def _partitions(steps: list[tuple[WorkflowStep, str]]) -> list[dict[str, Any]]:
    """A backfill's partitions (its steps' groups are the days) with the worst state of each."""
    by_day: dict[str, list[str]] = {}
    for step, state in steps:
        by_day.setdefault(step.group, []).append(state)
    cells = []
    for day, states in sorted(by_day.items()):
        state = next((s for s in SEVERITY if s in states), "waiting")
        fill, border = COLOURS[state]
        cells.append({"day": day, "state": state, "fill": fill, "border": border, "steps": len(states)})
    return cells
