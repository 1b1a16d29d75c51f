"""What every queue ModelAdmin shares: read-only screens, and changes only through Operations.

An Operation is one services.py function behind a custom permission. It runs on the selected rows, from the
change list and from the detail page (Django 6.1 action locations: ActionLocation.CHANGE_LIST and CHANGE_FORM),
or on every row matching the change list's current filter after a confirmation page that says how many. Every
run writes an admin LogEntry for each row it changed (none for the rows it left alone) and reports its
counts, naming the rows it left alone. A POST naming an action the user may not run is refused
with 403 rather than Django's quiet "No action selected".
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import model_ngettext
from django.contrib.admin.views.main import ERROR_FLAG, PAGE_VAR
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import BadRequest, PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from ..monitoring import capped_count
from .paginator import EstimatedCountPaginator

BOTH_LOCATIONS = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]
BULK_CHUNK = 1000  # rows per service call (one transaction each) when running on everything matching
BULK_COUNT_CAP = 100_000  # the confirmation page counts exactly up to here
BULK_SECONDS = 20.0  # one POST stops after this (below gunicorn's 30 s timeout) and offers to continue

# Custom permissions behind the operations (Meta.permissions), and Django's own delete permission for purges.
PERMISSIONS = {
    "requeue": "queue_app.requeue_queueitem",
    "cancel": "queue_app.cancel_queueitem",
    "pause": "queue_app.pause_queue",
    "purge": "queue_app.delete_deadletter",
}


@dataclass(frozen=True, slots=True)
class Operation:
    name: str  # the action's name, and the URL segment of its "all matching" page
    label: str  # "Requeue"
    done: str  # the report, "{n}" and "{noun}" filled in: "Requeued {n} {noun}"
    permission: str  # a key of PERMISSIONS; the ModelAdmin's has_<permission>_permission() decides
    eligible: Callable[[QuerySet], QuerySet]  # narrows to the rows the service changes
    eligible_label: str  # "dead or cancelled": what the rows it changes are
    apply: Callable[[list[Any], str], int]  # (primary keys, actor) -> rows changed: one services.py call
    bulk_button: bool = False  # offer "<label> all matching…" above the change list

    def as_action(self) -> Callable:
        def action(modeladmin: "OperationsAdmin", request: HttpRequest, queryset: QuerySet):
            return modeladmin.run_on_selected(request, queryset, self)

        action.__name__ = self.name
        return admin.action(
            action,
            permissions=[self.permission],
            description=f"{self.label} this %(verbose_name)s",
            description_plural=f"{self.label} selected %(verbose_name_plural)s",
            location=BOTH_LOCATIONS,
        )


MESSAGE_IDS = 10  # a message names at most this many rows, then says how many more


def _ids(values: list[Any]) -> str:
    shown = ", ".join(str(v) for v in values[:MESSAGE_IDS])
    return shown + (f" and {len(values) - MESSAGE_IDS} more" if len(values) > MESSAGE_IDS else "")


def keyset_chunks(queryset: QuerySet, size: int) -> Iterator[list[Any]]:
    """Primary keys of `queryset` in ascending chunks, each read after the previous one was processed (keyset
    pagination: no OFFSET, and rows an operation moved out of the filter do not shift later chunks)."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        pks = list(page.values_list("pk", flat=True)[:size])
        if not pks:
            return
        yield pks
        last = pks[-1]


def filter_query(request: HttpRequest) -> QueryDict:
    """The change list's filter and search parameters from the request, without page or error flags."""
    query = request.GET.copy()
    for name in (PAGE_VAR, ERROR_FLAG):
        query.pop(name, None)
    return query


class OperationsAdmin(admin.ModelAdmin):
    """Base of the queue's ModelAdmins: estimated counts, operations as actions, the "all matching" page."""

    operations: tuple[Operation, ...] = ()
    paginator = EstimatedCountPaginator
    list_per_page = 50  # rendering, not SQL, is what a page costs: ~0.5 ms of Python per row
    show_full_result_count = False  # that would be a COUNT(*) of the whole table on every page
    show_facets = admin.ShowFacets.NEVER  # facet counts are one COUNT per filter choice

    def action_checkbox(self, obj: Any) -> SafeString:
        # Django renders this checkbox through a form widget and its template, once per row: a fifth of a
        # 100-row list's render time. The same markup, formatted directly.
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            format_html(gettext("Select this object for an action - {}"), str(obj)),
        )

    # -- permissions ------------------------------------------------------------------------------------------

    def has_requeue_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["requeue"])

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["cancel"])

    def has_pause_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["pause"])

    def has_purge_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["purge"])

    def may(self, request: HttpRequest, op: Operation) -> bool:
        return getattr(self, f"has_{op.permission}_permission")(request)

    def _refuse_unpermitted_action(self, request: HttpRequest, location: ActionLocation) -> None:
        if request.method != "POST":
            return
        field = "action" if location == ActionLocation.CHANGE_LIST else f"{location.value}-action"
        posted = {name for name in request.POST.getlist(field) if name}
        if posted - set(self.get_actions(request, action_location=location)):
            raise PermissionDenied

    def _forged_ids(self, request: HttpRequest) -> list[str]:
        """Posted row ids that cannot be a primary key of this model (a forged or mangled form). Left to Django,
        they would fail the action's query with a 500."""
        if request.method != "POST":
            return []
        forged = []
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                self.opts.pk.to_python(value)
            except ValidationError:
                forged.append(value)
        return forged

    def _refuse_forged_ids(self, request: HttpRequest) -> HttpResponse | None:
        forged = self._forged_ids(request)
        if not forged:
            return None
        shown = ", ".join(repr(v) for v in forged[:5]) + (f" and {len(forged) - 5} more" if len(forged) > 5 else "")
        self.message_user(request, f"Not {self.opts.verbose_name} ids: {shown}. Nothing was changed.", messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())

    # -- views ------------------------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        self._refuse_unpermitted_action(request, ActionLocation.CHANGE_LIST)
        if refused := self._refuse_forged_ids(request):
            return refused
        context = {"object_tool_links": self.object_tool_links(request), **(extra_context or {})}
        return super().changelist_view(request, context)

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context=None
    ) -> HttpResponse:
        self._refuse_unpermitted_action(request, ActionLocation.CHANGE_FORM)
        if refused := self._refuse_forged_ids(request):
            return refused
        return super().changeform_view(request, object_id, form_url, extra_context)

    def object_tool_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        """(label, url) buttons above the change list."""
        query = filter_query(request).urlencode()
        return [
            (f"{op.label} all matching…", self.bulk_url(op, query))
            for op in self.operations
            if op.bulk_button and self.may(request, op)
        ]

    def url_name(self, suffix: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{suffix}"

    def get_urls(self) -> list:
        bulk = path(
            "bulk/<str:operation>/",
            self.admin_site.admin_view(self.bulk_view),
            name=self.url_name("bulk"),
        )
        return [bulk, *super().get_urls()]

    def bulk_url(self, op: Operation, query: str = "") -> str:
        url = reverse(f"{self.admin_site.name}:{self.url_name('bulk')}", args=[op.name])
        return f"{url}?{query}" if query else url

    def changelist_url(self, query: str = "") -> str:
        url = reverse(f"{self.admin_site.name}:{self.url_name('changelist')}")
        return f"{url}?{query}" if query else url

    # -- running operations -----------------------------------------------------------------------------------

    def run_on_selected(self, request: HttpRequest, queryset: QuerySet, op: Operation) -> HttpResponse | None:
        if not self.may(request, op):
            raise PermissionDenied
        if request.POST.get("select_across") == "1":  # "Select all N": the count is confirmed first
            return HttpResponseRedirect(self.bulk_url(op, filter_query(request).urlencode()))
        pks = list(queryset.values_list("pk", flat=True))
        eligible = set(op.eligible(queryset).values_list("pk", flat=True))
        # Posted ids that match no row here: deleted meanwhile, forged, or outside the change list's filter.
        found = {str(pk) for pk in pks}
        missing = [v for v in dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)) if v not in found]
        changed = op.apply(pks, request.user.get_username())
        changed_pks = self._changed(op, eligible, changed)
        left_alone = [pk for pk in pks if pk not in changed_pks]
        message = self.count_message(op, changed, left_alone, missing)
        if changed_pks:  # a LogEntry for each row the operation changed, none for the rows it left alone
            LogEntry.objects.log_actions(
                user_id=request.user.pk,
                queryset=self.logged_rows(changed_pks),
                action_flag=CHANGE,
                change_message=f"{message} (admin action {op.name})",
            )
        self.message_user(request, message, messages.SUCCESS if changed else messages.WARNING)
        return None

    def logged_rows(self, pks: set) -> QuerySet:
        """The rows an operation changed, as the admin log names them (where they are after it)."""
        return self.model._default_manager.filter(pk__in=pks)

    def _changed(self, op: Operation, eligible: set, changed: int) -> set:
        """The rows an operation changed, of those that were eligible just before it ran: all of them when the
        counts agree; else those it moved out of its eligible set (another actor may have moved a row at the
        same moment: such a row cannot be told apart)."""
        if changed == len(eligible) or not eligible:
            return eligible
        still = op.eligible(self.model._default_manager.filter(pk__in=eligible)).values_list("pk", flat=True)
        return eligible - set(still)

    def count_message(self, op: Operation, changed: int, left_alone: list[Any], missing: list[str]) -> str:
        """ "Cancelled 2 of 3 selected queue items; the other 1 were not ready or reserved and were left alone:
        17." Names the rows left alone and the ids that matched nothing (the first MESSAGE_IDS of each)."""
        selected = changed + len(left_alone) + len(missing)
        if not left_alone and not missing:
            return op.done.format(n=changed, noun=model_ngettext(self.opts, changed)) + "."
        report = op.done.format(n=f"{changed} of {selected} selected", noun=model_ngettext(self.opts, selected))
        if not missing:
            alone = f"the other {len(left_alone)} were not {op.eligible_label} and were left alone"
            return f"{report}; {alone}: {_ids(left_alone)}."
        parts = [report]
        if left_alone:
            parts.append(f"{len(left_alone)} were not {op.eligible_label} and were left alone: {_ids(left_alone)}")
        parts.append(
            f"{len(missing)} matched no {self.opts.verbose_name} (deleted, or outside the current filter): "
            f"{_ids(missing)}"
        )
        return "; ".join(parts) + "."

    def log_summary(self, request: HttpRequest, action_flag: int, object_repr: str, message: str) -> None:
        """One LogEntry for an operation on a set too large to log row by row."""
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(self.model).pk,
            object_id=None,
            object_repr=object_repr[:200],
            action_flag=action_flag,
            change_message=message,
        )

    def bulk_view(self, request: HttpRequest, operation: str) -> HttpResponse:
        """GET: how many rows matching the change list's filter the operation would change. POST: change them,
        in keyset chunks of BULK_CHUNK, each chunk one service call, for at most BULK_SECONDS; what is left
        (changed rows leave the filter's eligible set) is offered again on the confirmation page."""
        op = next((o for o in self.operations if o.name == operation), None)
        if op is None:
            raise Http404(f"no operation {operation!r} here")
        if not (self.has_view_permission(request) and self.may(request, op)):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters as exc:
            raise BadRequest("invalid filter") from exc
        matching = op.eligible(changelist.get_queryset(request))
        query = filter_query(request).urlencode()
        plural = self.opts.verbose_name_plural
        if request.method == "POST":
            actor, changed, finished = request.user.get_username(), 0, True
            deadline = time.monotonic() + BULK_SECONDS
            for chunk in keyset_chunks(matching, BULK_CHUNK):
                changed += op.apply(chunk, actor)
                if time.monotonic() > deadline:
                    finished = False
                    break
            scope = f"matching {query}" if query else "(no filter)"
            message = op.done.format(n=changed, noun=model_ngettext(self.opts, changed)) + f" {scope}."
            self.log_summary(request, CHANGE, f"{changed} {plural} {scope}", f"{message} (admin bulk {op.name})")
            if not finished:
                self.message_user(request, f"{message} More remain: confirm again to continue.", messages.WARNING)
                return HttpResponseRedirect(self.bulk_url(op, query))
            self.message_user(request, message, messages.SUCCESS if changed else messages.WARNING)
            return HttpResponseRedirect(self.changelist_url(query))
        count = capped_count(matching, BULK_COUNT_CAP + 1)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{op.label} all matching {plural}?",
            "opts": self.opts,
            "operation": op,
            "count": min(count, BULK_COUNT_CAP),
            "more": count > BULK_COUNT_CAP,
            "plural": model_ngettext(self.opts, count),
            "filters": [(name, value) for name, values in filter_query(request).lists() for value in values],
            "changelist_url": self.changelist_url(query),
        }
        return TemplateResponse(request, "admin/queue_app/bulk_confirm.html", context)


class ReadOnlyAdmin(OperationsAdmin):
    """Rows written only by the engine and services.py: viewable, never added, edited or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
