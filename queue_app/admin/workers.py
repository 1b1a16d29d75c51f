"""Workers: who is registered, what they serve, and whether their heartbeat is recent. Read-only."""

from django.contrib import admin
from django.utils import timezone
from django.utils.safestring import SafeString

from ..models import Worker
from ..monitoring import worker_alive_within
from .actions import ReadOnlyAdmin
from .display import cut, pretty_json, time_column
from .filters import exact_search


class AliveFilter(admin.SimpleListFilter):
    title = "heartbeat"
    parameter_name = "alive"

    def lookups(self, request, model_admin):
        seconds = int(worker_alive_within().total_seconds())
        return [("yes", f"Within {seconds} s"), ("no", f"Older than {seconds} s")]

    def queryset(self, request, queryset):
        since = timezone.now() - worker_alive_within()
        if self.value() == "yes":
            return queryset.filter(last_heartbeat__gte=since)
        if self.value() == "no":
            return queryset.filter(last_heartbeat__lt=since)
        return queryset


class WorkerAdmin(ReadOnlyAdmin):
    # State and heartbeat first: they stay on screen at 1,440 px; ids, hosts and queue lists are cut, whole on
    # hover (the pid and start time are on the worker's page).
    list_display = (
        "worker",
        "state",
        "alive",
        "heartbeat",
        "queues_short",
        "concurrency",
        "host_short",
        "stats_short",
    )
    list_filter = ("state", AliveFilter)
    search_fields = ("=id", "=host")
    search_help_text = "Exact worker id or host."
    fields = (
        "id",
        "host",
        "pid",
        "queue_names",
        "concurrency",
        "state",
        "started_at",
        "last_heartbeat",
        "alive",
        "stats_pretty",
    )
    readonly_fields = ("queue_names", "alive", "stats_pretty")
    heartbeat = time_column("last_heartbeat", "last heartbeat", ordering="last_heartbeat")

    def get_search_results(self, request, queryset, search_term):
        return exact_search(queryset, search_term, ids=(), keys=("id", "host")), False

    @admin.display(description="queues")
    def queue_names(self, obj: Worker) -> str:
        return ", ".join(obj.queues) if obj.queues else "all"

    @admin.display(description="id", ordering="id")
    def worker(self, obj: Worker) -> SafeString | str:
        return cut(obj.id)

    @admin.display(description="queues")
    def queues_short(self, obj: Worker) -> SafeString | str:
        return cut(self.queue_names(obj), "narrow")

    @admin.display(description="host", ordering="host")
    def host_short(self, obj: Worker) -> SafeString | str:
        return cut(obj.host, "narrow")

    @admin.display(description="alive", boolean=True)
    def alive(self, obj: Worker) -> bool:
        return obj.last_heartbeat >= timezone.now() - worker_alive_within()

    @admin.display(description="stats")
    def stats_short(self, obj: Worker) -> SafeString | str:
        return cut(", ".join(f"{k}={v}" for k, v in (obj.stats or {}).items()), "narrow")

    @admin.display(description="stats")
    def stats_pretty(self, obj: Worker):
        return pretty_json(obj.stats)
