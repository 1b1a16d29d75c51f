"""The partitioned history (engine/history.py): archived items and their attempts, read-only like the hot lists
(filter by queue, state, task, finished time; exact search on id and keys), an archived item's detail page with
its attempt timeline, and requeue of an archived cancelled item (services.requeue_items moves it back)."""

from dataclasses import replace

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..models import ItemHistory, QueueItem, ReservationHistory
from . import items
from .actions import ReadOnlyAdmin
from .display import HEAD_CHARS, AttemptColumns, ItemColumns, time_column
from .filters import BIGINT_MAX, TaskFilter, recent
from .items import ItemFields, attempt_timeline
from .reservations import AttemptText, ReservationAdmin


class QueueFilter(admin.SimpleListFilter):
    """The queues by name (the history has no foreign key to Queue: a queue may be gone while its history stays)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        from ..models import Queue

        return [(name, name) for name in Queue.objects.values_list("name", flat=True)]

    def queryset(self, request, queryset):
        return queryset.filter(queue_id=self.value()) if self.value() else queryset


# The items' requeue (services.requeue_items moves an archived item back first); no "all matching" page here.
REQUEUE = replace(items.REQUEUE, bulk_button=False)


class ItemHistoryAdmin(ItemFields, ReadOnlyAdmin):
    created_at_short = time_column("created_at", "created at")
    finished_at_short = time_column("finished_at", "finished at")
    operations = (REQUEUE,)
    actions = [op.as_action() for op in operations]
    list_display = (
        "id",
        "state_shown",
        "attempts_of",
        "task_queue",
        "created_at_short",
        "finished_at_short",
        "error_short",
        "payload_short",
        "keys",
    )
    list_filter = (QueueFilter, "state", TaskFilter, recent("finished_at", "finished", "finished"))
    sortable_by = ("id",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "queue_id",
                    "task",
                    "state_shown",
                    "priority",
                    "attempts_of",
                    "dedup_key",
                    "ordering_key",
                    "group_key",
                )
            },
        ),
        ("Timing", {"fields": ("run_at_s", "created_at_s", "updated_at_s", "finished_at_s", "lease_timeout")}),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Outcome", {"fields": ("error_full", "result_pretty")}),
        ("Attempts", {"fields": ("timeline",)}),
    )
    readonly_fields = (
        "state_shown",
        "run_at_s",
        "created_at_s",
        "updated_at_s",
        "finished_at_s",
        "attempts_of",
        "payload_pretty",
        "error_full",
        "result_pretty",
        "timeline",
    )

    def logged_rows(self, pks: set) -> QuerySet:
        # A requeued item has moved back into the hot table: its log entry names it there.
        return QueueItem.objects.filter(pk__in=pks)

    @admin.display(description="attempt timeline")
    def timeline(self, obj: ItemHistory) -> SafeString:
        return attempt_timeline(obj, ReservationHistory.objects.filter(item_id=obj.id))


class ReservationHistoryAdmin(AttemptText, AttemptColumns, ReadOnlyAdmin):
    error_short = ItemColumns.error_short
    list_display = ("id", "item", "outcome", "attempt", "worker", "reserved", "finished", "error_short")
    list_filter = ("outcome", recent("reserved_at", "reserved", "reserved"))
    sortable_by = ("id",)
    search_fields = ("=id", "=item_id")
    search_help_text = "Exact reservation or item id (123 or #123)."
    fields = tuple(f for f in ReservationAdmin.fields if f != "task")  # the item's task is on its own page
    readonly_fields = ("item", "error_full", "traceback_full")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("error", "traceback").annotate(error_head=Left("error", HEAD_CHARS))

    def get_search_results(self, request, queryset, search_term):
        # One OR of the two ids: a BitmapOr of the primary key and reservationhistory_item in each partition
        # (exact_search's `pk IN (... UNION ALL ...)` walked every partition's primary key). No worker-id search
        # here: an index on it would be one more write per archived attempt.
        number = search_term.strip().removeprefix("#")
        if not search_term.strip():
            return queryset, False
        if not number.isdigit() or int(number) > BIGINT_MAX:
            return queryset.none(), False
        return queryset.filter(Q(id=int(number)) | Q(item_id=int(number))), False

    @admin.display(description="item", ordering="item_id")
    def item(self, obj: ReservationHistory) -> SafeString:
        url = reverse("admin:queue_app_itemhistory_change", args=[obj.item_id])
        return format_html('<a href="{}">#{}</a>', url, obj.item_id)
