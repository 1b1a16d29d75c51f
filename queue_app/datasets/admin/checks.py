"""The admin's dataset check results (issue 38): one row per (materialization, check), read only, filterable by
state and severity, and the permissioned action "Override the failed checks" (a confirmation page asks for the
comment; datasets/checks_run.override_failed_checks does it, with a LogEntry per materialization). The datasets'
own pages (the list, a dataset's page) are datasets' admin, not this module."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ...admin.display import cut, time_column
from ..checks_run import may_override, override_failed_checks
from ..declarations import DatasetError
from ..models import CheckState, DatasetCheckResult, Materialization

TEMPLATE = "admin/jobsite_datasets/datasets/override_confirm.html"


class ResultFilter(admin.SimpleListFilter):
    title = "result"
    parameter_name = "result"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("passed", "passed"), ("failed", "failed"), ("pending", "pending")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "pending":
            return queryset.filter(passed__isnull=True)
        return queryset.filter(passed=value == "passed") if value in ("passed", "failed") else queryset


@admin.register(DatasetCheckResult)
class DatasetCheckResultAdmin(admin.ModelAdmin):
    # At 1,440 px the list fits its box (between the sidebar and the filters): the check's name and the result's
    # message are cut, whole on hover and on the result's page.
    list_display = ("dataset", "partition_shown", "check_shown", "blocking_shown", "result", "state", "at_short")
    list_filter = (ResultFilter, "severity", "blocking")
    search_fields = ("=dataset", "check_name")
    readonly_fields = [
        "blocking_shown" if f.name == "blocking" else f.name for f in DatasetCheckResult._meta.fields
    ] + ["state"]
    fields = readonly_fields
    actions = ["override_checks"]
    list_per_page = 50
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_override_permission(self, request: HttpRequest) -> bool:
        return may_override(request.user)

    @admin.display(description="partition", ordering="partition")
    def partition_shown(self, obj: DatasetCheckResult) -> str:
        return obj.partition or "-"

    @admin.display(description="check", ordering="check_name")
    def check_shown(self, obj: DatasetCheckResult) -> SafeString | str:
        return cut(obj.check_name, "narrow")

    @admin.display(description="kind", ordering="blocking")
    def blocking_shown(self, obj: DatasetCheckResult) -> str:
        """Words, not Django's boolean icon (a red cross on a warn check read as a failed check): "blocking" (an
        error check, the default), "warn" (a warn check, the default), and the two uncommon mixes said whole."""
        if obj.blocking:
            return "blocking" if obj.severity == "error" else "blocking (warn)"
        return "warn" if obj.severity == "warn" else "error, not blocking"

    @admin.display(description="result")
    def result(self, obj: DatasetCheckResult) -> SafeString:
        if obj.passed is None:
            return format_html('<span class="check-result">{}</span>', "pending")
        head = "passed" if obj.passed else "failed"
        shown = f"{head}: {obj.message}" if obj.message else head
        return format_html('<span class="check-result check-{}">{}</span>', head, cut(shown) if obj.message else shown)

    at_short = time_column("at", "at", ordering="at")

    @admin.display(description="all checks")
    def state(self, obj: DatasetCheckResult) -> str:
        return getattr(obj, "materialization_checks", None) or ""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Each row's materialization's state: one primary-key probe per row of the page, in the page's query.
        state = Materialization.objects.filter(id=OuterRef("materialization_id")).values("checks")[:1]
        return super().get_queryset(request).annotate(materialization_checks=Subquery(state))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        # A POST of the action by a user not offered it is refused (403), not Django's quiet "No action selected".
        if (
            request.method == "POST"
            and request.POST.get("action") == "override_checks"
            and not may_override(request.user)
        ):
            raise PermissionDenied(
                "overriding dataset checks needs the jobsite_datasets.override_dataset_check permission"
            )
        return super().changelist_view(request, extra_context)

    @admin.action(permissions=["override"], description="Override the failed checks of the selected results")
    def override_checks(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        if not may_override(request.user):
            raise PermissionDenied(
                "overriding dataset checks needs the jobsite_datasets.override_dataset_check permission"
            )
        ids = sorted(set(queryset.values_list("materialization_id", flat=True)))
        failed = list(Materialization.objects.filter(id__in=ids, checks=CheckState.FAILED).order_by("id"))
        comment = request.POST.get("comment", "").strip()
        if request.POST.get("post") and comment:
            done = []
            for m in failed:
                try:
                    done.append(override_failed_checks(request.user, m.id, comment))
                except DatasetError as exc:  # overridden or re-checked meanwhile
                    self.message_user(request, str(exc), messages.WARNING)
            named = ", ".join(f"{m.dataset}[{m.partition}]" for m in done)
            self.message_user(request, f"Overrode the failed checks of {len(done)}: {named}", messages.SUCCESS)
            return None
        if not failed:
            self.message_user(request, "None of the selected results' materializations failed: nothing to override.")
            return None
        if request.POST.get("post"):
            self.message_user(request, "An override needs a comment saying why.", messages.ERROR)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Override failed dataset checks",
            "changelist_url": reverse(f"{self.admin_site.name}:jobsite_datasets_datasetcheckresult_changelist"),
            "materializations": failed,
            "selected": queryset.values_list("pk", flat=True),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, TEMPLATE, context)
