"""Queue items: the list (filter by queue, state, task, time; exact search on id, dedup key, ordering key) and the
read-only detail page (payload pretty-printed, attempt timeline, dead-letter reason). Requeue, retry now and
cancel run through services.py."""

from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast, Left, Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import services
from ..conf import queue_settings
from ..flow import effective_priority
from ..hooks import why_held
from ..models import HISTORY_STATES, ItemHistory, ItemState, Queue, QueueItem
from ..monitoring import history_count, shown_state
from .actions import Operation, ReadOnlyAdmin
from .display import (
    HEAD_CHARS,
    cut,
    list_time,
    preformatted,
    pretty_json,
    seconds_field,
    shorten,
    task_in_queue,
    time_column,
)
from .filters import StateFilter, TaskFilter, exact_search, recent

TIMELINE_ATTEMPTS = 100  # the detail page shows this many most recent attempts

REQUEUE = Operation(
    name="requeue",
    label="Requeue",
    done="Requeued {n} {noun}",
    permission="requeue",
    eligible=lambda qs: qs.filter(state__in=services.REQUEUEABLE),
    eligible_label="dead or cancelled",
    apply=lambda pks, actor: services.requeue_items(pks, actor=actor),
    bulk_button=True,
)
RETRY_NOW = Operation(
    name="retry_now",
    label="Retry now",
    done="Made {n} {noun} due now",
    permission="requeue",
    eligible=lambda qs: qs.filter(state=ItemState.READY, visible_at__gt=Now()),
    eligible_label="ready and waiting for their run time or backoff",
    apply=lambda pks, actor: services.retry_now(pks),
)
CANCEL = Operation(
    name="cancel",
    label="Cancel",
    done="Cancelled {n} {noun}",
    permission="cancel",
    eligible=lambda qs: qs.filter(state__in=services.CANCELLABLE),
    eligible_label="ready or reserved",
    apply=lambda pks, actor: services.cancel_items(pks, actor=actor),
)


def attempt_timeline(item: QueueItem | ItemHistory, reservations: QuerySet | None = None) -> SafeString:
    """The item's most recent attempts (`reservations`: the archived ones of an archived item)."""
    reservations = item.reservations.all() if reservations is None else reservations
    attempts = list(reservations.order_by("-id")[:TIMELINE_ATTEMPTS])[::-1]
    return render_to_string(
        "admin/queue_app/attempt_timeline.html",
        {"attempts": attempts, "current": item.reservation_id, "limit": TIMELINE_ATTEMPTS},
    )


class ItemFields:
    """What an item's list and page show, hot or archived (QueueItemAdmin, history.ItemHistoryAdmin): payload and
    error cut short in lists (the database sends only their first HEAD_CHARS), whole on the page; exact search on
    the id and keys."""

    search_fields = ("=id", "=dedup_key", "=ordering_key", "=group_key")  # see get_search_results: exact only
    search_help_text = "Exact item id (123 or #123), dedup key, ordering key or group key."

    # The detail page's times, to the second (a retry's backoff hides in minutes).
    run_at_s = seconds_field("run_at", "run at")
    visible_at_s = seconds_field("visible_at", "visible at (due, or lease until)")
    created_at_s = seconds_field("created_at", "created at")
    updated_at_s = seconds_field("updated_at", "updated at")
    finished_at_s = seconds_field("finished_at", "finished at")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .defer("payload", "result", "error")
            .annotate(
                payload_head=Left(Cast("payload", TextField()), HEAD_CHARS),
                error_head=Left("error", HEAD_CHARS),
            )
        )

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, ids=("id",), keys=("dedup_key", "ordering_key", "group_key")), False

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj: QueueItem) -> str:
        return shown_state(obj.state, getattr(obj, "visible_at", None), timezone.now())

    @admin.display(description="attempts")
    def attempts_of(self, obj: QueueItem) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="task (queue)")
    def task_queue(self, obj: QueueItem) -> SafeString:
        return task_in_queue(obj.task, obj.queue_id)

    @admin.display(description="dedup / ordering / group key")
    def keys(self, obj: QueueItem) -> SafeString | str:
        return cut(" / ".join(k for k in (obj.dedup_key, obj.ordering_key, obj.group_key) if k), "narrow")

    @admin.display(description="payload")
    def payload_short(self, obj: QueueItem) -> SafeString | str:
        return cut(shorten(obj.payload_head, HEAD_CHARS), "narrow")

    @admin.display(description="error")
    def error_short(self, obj: QueueItem) -> SafeString | str:
        return cut(shorten(obj.error_head, HEAD_CHARS), "narrow")

    run_at_short = time_column("run_at", "run at")

    @admin.display(description="payload")
    def payload_pretty(self, obj: QueueItem) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="result")
    def result_pretty(self, obj: QueueItem) -> SafeString | str:
        return "-" if obj.result is None else pretty_json(obj.result)

    @admin.display(description="last error")
    def error_full(self, obj: QueueItem) -> SafeString | str:
        return preformatted(obj.error)


def history_note(request: HttpRequest) -> dict | None:
    """Where the finished items of the list's queue (and finished state) are once the archiver moved them: a link
    to Item history with their count (an estimate past a thousand). None for a list of unfinished states."""
    queue = request.GET.get("queue__name__exact", "")
    state = request.GET.get("state__exact", "")
    if state and state not in HISTORY_STATES:
        return None
    params = {key: value for key, value in (("queue", queue), ("state", state)) if value}
    return {
        "what": "Finished items",
        "where": "Item history",
        "count": history_count(queue or None, state or None),
        "after": f"{queue_settings.ARCHIVE_AFTER:g}",
        "url": f"{reverse('admin:queue_app_itemhistory_changelist')}?{urlencode(params)}".rstrip("?"),
    }


class QueueItemAdmin(ItemFields, ReadOnlyAdmin):
    operations = (REQUEUE, RETRY_NOW, CANCEL)
    actions = [op.as_action() for op in operations]
    # What matters first (state, attempts) stays on screen at 1,440 px; long values are cut, whole on hover.
    list_display = (
        "id",
        "state_shown",
        "attempts_of",
        "task_queue",
        "run_at_short",
        "created",
        "error_short",
        "payload_short",
        "keys",
    )
    list_filter = ("queue", StateFilter, TaskFilter, recent("created_at", "created", "created", mark="item_id"))
    sortable_by = ("id", "created")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "queue",
                    "task",
                    "state_shown",
                    "blocked_by",
                    "priority",
                    "effective_priority",
                    "attempts_of",
                    "dedup_key",
                    "debounce_key",
                    "absorbed_shown",
                    "ordering_key",
                    "group_key",
                )
            },
        ),
        (
            "Timing",
            {"fields": ("run_at_s", "visible_at_s", "created_at_s", "updated_at_s", "finished_at_s", "lease_timeout")},
        ),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Outcome", {"fields": ("dead_letter", "error_full", "result_pretty")}),
        ("Attempts", {"fields": ("timeline",)}),
    )
    readonly_fields = (
        "state_shown",
        "blocked_by",
        "effective_priority",
        "absorbed_shown",
        "run_at_s",
        "visible_at_s",
        "created_at_s",
        "updated_at_s",
        "finished_at_s",
        "attempts_of",
        "payload_pretty",
        "dead_letter",
        "error_full",
        "result_pretty",
        "timeline",
    )

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        return super().changelist_view(request, {**(extra_context or {}), "history_note": history_note(request)})

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None) -> HttpResponse:
        # An item archived since the link was made (a dead letter's, a Spark run's, a workflow step's) is shown
        # on its history page.
        if (
            object_id
            and object_id.isdigit()
            and not QueueItem.objects.filter(pk=object_id).exists()
            and ItemHistory.objects.filter(pk=object_id).exists()
        ):
            return HttpResponseRedirect(
                reverse(f"{self.admin_site.name}:queue_app_itemhistory_change", args=[object_id])
            )
        item = (
            QueueItem.objects.filter(pk=object_id).only("id", "task", "state", "visible_at").first()
            if object_id and object_id.isdigit()
            else None
        )
        if item is not None:  # the page's title and breadcrumb say the state as its State field does
            state = "blocked" if why_held([item.id]) else shown_state(item.state, item.visible_at, timezone.now())
            title = f"#{item.id} {item.task} ({state})"
            extra_context = {**(extra_context or {}), "subtitle": title, "shown_title": title}
        return super().changeform_view(request, object_id, form_url, extra_context)

    # Sorted by id: ids are handed out in creation order, and an index on created_at would cost every enqueue one
    # more entry (the list's "created" time filter walks the primary key from the newest item down).
    @admin.display(description="created at", ordering="id")
    def created(self, obj: QueueItem) -> SafeString | str:
        return list_time(obj.created_at)

    @admin.display(description="blocked by")
    def blocked_by(self, obj: QueueItem) -> str:
        """Why a parked item waits (a dataset partition it reads is not usable: datasets/checks_run.py)."""
        return why_held([obj.id]).get(obj.id, "-")

    @admin.display(description="dead letter")
    def dead_letter(self, obj: QueueItem) -> SafeString | str:
        letter = obj.dead_letters.order_by("-id").first()
        if letter is None:
            return "-"
        requeued = (
            format_html(" — requeued {} by {}", letter.requeued_at, letter.requeued_by or "?")
            if letter.requeued_at
            else ""
        )
        return format_html("<strong>{}</strong> (died {}){}", letter.reason, letter.died_at, requeued)

    @admin.display(description="attempt timeline")
    def timeline(self, obj: QueueItem) -> SafeString:
        return attempt_timeline(obj)

    @admin.display(description="effective priority")
    def effective_priority(self, obj: QueueItem) -> str:
        """Its priority with the queue's aging (flow.effective_priority), while it waits due."""
        rate = Queue.objects.filter(name=obj.queue_id).values_list("aging_rate", flat=True).first()
        shown = effective_priority(obj.priority, rate, obj.state, obj.visible_at, timezone.now())
        if rate is None:
            return f"{shown:g} (the queue has no aging)"
        return f"{shown:.2f} (aging {rate:g} points/s while due)"

    @admin.display(description="absorbed enqueues")
    def absorbed_shown(self, obj: QueueItem) -> str:
        if obj.debounce_key is None:
            return "-"
        until = f"; runs at the latest at {obj.debounce_until:%Y-%m-%d %H:%M:%S}" if obj.debounce_until else ""
        return f"{obj.absorbed} enqueues of its debounce key absorbed (the latest payload kept){until}"
