"""Dead letters: why an item died, filtered by queue, task, status and time; requeue (selected, or everything
matching after a confirmation) and purge of old dead items, both through services.py."""

from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from .. import services
from ..models import DeadLetter, ItemState, QueueItem
from ..monitoring import capped_count
from .actions import BULK_COUNT_CAP, Operation, ReadOnlyAdmin
from .display import HEAD_CHARS, ItemColumns, cut, preformatted, pretty_json, time_column
from .filters import ItemTaskFilter, exact_search, recent
from .items import attempt_timeline

REQUEUE = Operation(
    name="requeue",
    label="Requeue",
    done="Requeued the items of {n} {noun}",
    permission="requeue",
    eligible=lambda qs: qs.filter(requeued_at__isnull=True, item__state__in=services.REQUEUEABLE),
    eligible_label="open (not requeued yet)",
    apply=lambda pks, actor: services.requeue_dead_letters(pks, actor=actor),
    bulk_button=True,
)

PURGE_AGES = {
    "1d": ("1 day", timedelta(days=1)),
    "7d": ("7 days", timedelta(days=7)),
    "30d": ("30 days", timedelta(days=30)),
}


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("open", "Open"), ("requeued", "Requeued")]

    def queryset(self, request, queryset):
        if self.value() == "open":
            # An open letter's item is dead: it dies with the letter written, and only a requeue
            # (services.requeue_items, which closes its letters) or a purge (which deletes both) ends that. Said
            # here, the planner can use the dead items' indexes (item_task_not_done, item_history) with a queue or
            # task filter: 10M open items, "open, queue + task" p95 566 -> 153-189 ms (it read the item table whole).
            return queryset.filter(requeued_at__isnull=True, item__state=ItemState.DEAD)
        if self.value() == "requeued":
            return queryset.filter(requeued_at__isnull=False)
        return queryset


class DeadLetterAdmin(ItemColumns, ReadOnlyAdmin):
    operations = (REQUEUE,)
    actions = [op.as_action() for op in operations]
    list_display = ("id", "item_link", "task_queue", "reason_short", "error_short", "died", "requeued")
    list_select_related = ("item",)
    list_filter = ("item__queue", ItemTaskFilter, StatusFilter, recent("died_at", "died", "died"))
    sortable_by = ("id", "died_at")
    search_fields = ("=id", "=item__id", "=item__dedup_key", "=item__ordering_key")
    search_help_text = "Exact dead-letter or item id (123 or #123), or the item's dedup or ordering key."
    fields = (
        "id",
        "item",
        "queue",
        "task",
        "reason",
        "died_at",
        "requeued_at",
        "requeued_by",
        "error_full",
        "payload",
        "timeline",
    )
    readonly_fields = ("item", "queue", "task", "error_full", "payload", "timeline")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .defer("last_error", "item__payload", "item__result", "item__error")
            .annotate(error_head=Left("last_error", HEAD_CHARS))
        )

    def get_search_results(self, request, queryset, search_term):
        found = exact_search(
            queryset, search_term, ids=("id", "item_id"), keys=("item__dedup_key", "item__ordering_key")
        )
        return found, False

    died = time_column("died_at", "died at", ordering="died_at")

    @admin.display(description="reason")
    def reason_short(self, obj: DeadLetter) -> SafeString | str:
        return cut(obj.reason, "narrow")  # room for seven-digit ids at 1,440 px

    @admin.display(description="requeued", boolean=True)
    def requeued(self, obj: DeadLetter) -> bool:
        return obj.requeued_at is not None

    @admin.display(description="last error")
    def error_full(self, obj: DeadLetter) -> SafeString | str:
        return preformatted(obj.last_error)

    @admin.display(description="item payload")
    def payload(self, obj: DeadLetter) -> SafeString:
        return pretty_json(obj.item.payload)

    @admin.display(description="attempt timeline")
    def timeline(self, obj: DeadLetter) -> SafeString:
        return attempt_timeline(obj.item)

    # -- purge ------------------------------------------------------------------------------------------------

    def get_urls(self) -> list:
        purge = path("purge/", self.admin_site.admin_view(self.purge_view), name=self.url_name("purge"))
        return [purge, *super().get_urls()]

    def object_tool_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        links = super().object_tool_links(request)
        if self.has_purge_permission(request):
            links.append(("Purge old dead letters…", reverse(f"{self.admin_site.name}:{self.url_name('purge')}")))
        return links

    def purge_view(self, request: HttpRequest) -> HttpResponse:
        """Delete items dead for longer than a chosen age (services.purge_dead_letters), after showing how many
        each age would remove."""
        if not self.has_purge_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            choice = PURGE_AGES.get(request.POST.get("older_than", ""))
            if choice is None:
                raise BadRequest("choose an age")
            label, age = choice
            purged = services.purge_dead_letters(age)
            message = f"Purged {purged} items dead for more than {label}, with their dead letters and attempts."
            self.log_summary(request, DELETION, f"{purged} dead items older than {label}", message)
            self.message_user(request, message, messages.SUCCESS if purged else messages.WARNING)
            return HttpResponseRedirect(self.changelist_url())
        now = timezone.now()
        ages = []
        for key, (label, age) in PURGE_AGES.items():
            dead = QueueItem.objects.filter(state=ItemState.DEAD, finished_at__lt=now - age)
            count = capped_count(dead, BULK_COUNT_CAP + 1)
            ages.append(
                {"key": key, "label": label, "count": min(count, BULK_COUNT_CAP), "more": count > BULK_COUNT_CAP}
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Purge old dead letters",
            "opts": self.opts,
            "ages": ages,
            "changelist_url": self.changelist_url(),
        }
        return TemplateResponse(request, "admin/queue_app/purge_confirm.html", context)
