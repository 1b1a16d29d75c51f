"""Reservations: the attempt history (worker, lease, outcome, error, traceback). Read-only; nothing to run."""

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.safestring import SafeString

from ..conf import queue_settings
from ..models import Reservation, ReservationHistory
from ..monitoring import archived_count
from .actions import ReadOnlyAdmin
from .display import HEAD_CHARS, AttemptColumns, ItemColumns, preformatted
from .filters import exact_search, recent


class AttemptText:
    """An attempt's error and traceback, whole, on its page (hot or archived)."""

    @admin.display(description="error")
    def error_full(self, obj: Reservation) -> SafeString | str:
        return preformatted(obj.error)

    @admin.display(description="traceback")
    def traceback_full(self, obj: Reservation) -> SafeString | str:
        return preformatted(obj.traceback)


class ReservationAdmin(AttemptText, AttemptColumns, ItemColumns, ReadOnlyAdmin):
    # The outcome first: on screen at 1,440 px, with the task and queue in one column.
    list_display = (
        "id",
        "item_link",
        "outcome",
        "attempt",
        "task_queue",
        "worker",
        "reserved",
        "lease_until",
        "finished",
        "error_short",
    )
    list_select_related = ("item",)
    list_filter = ("outcome", "item__queue", recent("reserved_at", "reserved", "reserved", mark="reservation_id"))
    sortable_by = ("id",)
    search_fields = ("=id", "=item__id", "=worker_id")
    search_help_text = "Exact reservation or item id (123 or #123), or worker id (a number is taken for an id)."
    fields = (
        "id",
        "item",
        "task",
        "attempt",
        "worker_id",
        "reserved_at",
        "lease_expires_at",
        "heartbeat_at",
        "finished_at",
        "outcome",
        "error_full",
        "traceback_full",
    )
    readonly_fields = ("item", "task", "error_full", "traceback_full")

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        # Where the attempts of finished items went (the item list says the same of its items).
        note = {
            "what": "The attempts of finished items",
            "where": "Reservation history",
            "count": archived_count(ReservationHistory.objects.all()),
            "after": f"{queue_settings.ARCHIVE_AFTER:g}",
            "url": reverse("admin:queue_app_reservationhistory_changelist"),
        }
        return super().changelist_view(request, {**(extra_context or {}), "history_note": note})

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .defer("error", "traceback", "item__payload", "item__result", "item__error")
            .annotate(error_head=Left("error", HEAD_CHARS))
        )

    def get_search_results(self, request, queryset, search_term):
        # No index on worker_id (every lease would write it): a number is taken for an id only, so that an id
        # search is two index probes rather than a read of the whole table as well (1.3M reservations: 370 ms).
        number = search_term.strip().removeprefix("#").isdigit()
        keys = () if number else ("worker_id",)
        return exact_search(queryset, search_term, ids=("id", "item_id"), keys=keys), False
