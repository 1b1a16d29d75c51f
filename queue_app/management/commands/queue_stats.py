"""`manage.py queue_stats [--json] [--groups]`: per queue, items by state ("ready" = due now, "scheduled" = ready but
due later: delay or backoff; the admin's vocabulary, monitoring.SHOWN_STATES), the age of the oldest due ready item,
open dead letters, and `absorbed`: the debounced enqueues collapsed into an item of their key. Exact counts (one
grouped scan of the item table): meant for operators and scripts, not for a dashboard refreshed every second on a
huge table. With --groups, each queue also gets `groups`: group key -> counts by state (keyed items only); and each
queue says what flow control it has and what holds it back now (flow.held_back).

The autoscaling fields (`in_flight`, `workers_alive`, `throughput_per_worker`, `suggested_workers`) are /metrics'
figures (monitoring.snapshot over its window, queue_app/autoscaling.py), so a script and a scraper see the same
suggestion."""

import json

from django.db.models import Count, Min, Q, Sum
from django.db.models.functions import Now
from django.utils import timezone

from queue_app.flow import format_rate, group_counts, held_back
from queue_app.management.base import JobsiteCommand
from queue_app.models import DeadLetter, ItemHistory, ItemState, Queue, QueueItem
from queue_app.monitoring import METRICS_WINDOW_MINUTES, SHOWN_STATES, QueueStats, snapshot

STATES = [state.value for state in ItemState]


def queue_stats(groups: bool = False) -> list[dict]:
    now = timezone.now()
    counts: dict[str, dict[str, int]] = {}
    absorbed: dict[str, int] = {}  # debounced enqueues collapsed into another item of their key, in the same scan
    for model in (QueueItem, ItemHistory):  # finished items the archiver moved count with the hot ones
        rows = model.objects.order_by().values("queue_id", "state").annotate(n=Count("id"), absorbed=Sum("absorbed"))
        for row in rows:
            by_state = counts.setdefault(row["queue_id"], {})
            by_state[row["state"]] = by_state.get(row["state"], 0) + row["n"]
            absorbed[row["queue_id"]] = absorbed.get(row["queue_id"], 0) + (row["absorbed"] or 0)
    due = dict(
        QueueItem.objects.order_by()
        .filter(state=ItemState.READY, visible_at__lte=Now())
        .values("queue_id")
        .annotate(oldest=Min("run_at"))
        .values_list("queue_id", "oldest")
    )
    letters = dict(
        DeadLetter.objects.order_by()
        .filter(requeued_at__isnull=True)
        .values("item__queue_id")
        .annotate(n=Count("id"))
        .values_list("item__queue_id", "n")
    )
    scheduled = dict(
        QueueItem.objects.order_by()
        .filter(Q(state=ItemState.READY) & Q(visible_at__gt=Now()))
        .values("queue_id")
        .annotate(n=Count("id"))
        .values_list("queue_id", "n")
    )
    stats = []
    by_group = group_counts() if groups else {}
    holding = held_back()
    flow = {q.name: q for q in snapshot(window_minutes=METRICS_WINDOW_MINUTES).queues}
    for queue in Queue.objects.order_by("name"):
        by_state = {state: counts.get(queue.name, {}).get(state, 0) for state in STATES}
        by_state[ItemState.READY] -= scheduled.get(queue.name, 0)  # "ready" counts due items only
        oldest = due.get(queue.name)
        stats.append(
            {
                "queue": queue.name,
                "paused": queue.paused,
                "concurrency_limit": queue.concurrency_limit,
                **by_state,
                "scheduled": scheduled.get(queue.name, 0),  # ready, not due yet (delay or backoff)
                "oldest_ready_age": None if oldest is None else round((now - oldest).total_seconds(), 3),
                "dead_letters": letters.get(queue.name, 0),
                "absorbed": absorbed.get(queue.name, 0),  # debounced enqueues that updated a ready item of their key
                "aging_rate": queue.aging_rate,
                "rate_limit": format_rate(queue.rate_limit, queue.rate_period),
                "group_concurrency": queue.group_concurrency,
                "held_back": holding[queue.name].reasons if queue.name in holding else [],
                **_autoscaling(flow.get(queue.name)),
            }
        )
        if groups:
            stats[-1]["groups"] = {
                key: {state: counts.get(state, 0) for state in STATES}
                for key, counts in sorted(by_group.get(queue.name, {}).items())
            }
    return stats


def _autoscaling(q: QueueStats | None) -> dict:
    """The autoscaling fields: in flight (live leases), live workers serving the queue, items/s per worker over the
    last METRICS_WINDOW_MINUTES (None: unknown) and the suggested worker count."""
    if q is None:  # created after the snapshot was taken
        return {"in_flight": 0, "workers_alive": 0, "throughput_per_worker": None, "suggested_workers": 0}
    per_worker = q.autoscale.throughput_per_worker
    return {
        "in_flight": q.in_flight.value,
        "workers_alive": q.workers,
        "throughput_per_worker": None if per_worker is None else round(per_worker, 4),
        "suggested_workers": q.autoscale.suggested_workers,
    }


class Command(JobsiteCommand):
    help = "Show per-queue counts by state, the oldest ready item's age, and open dead letters."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.add_argument("--groups", action="store_true", help="add per queue its group keys' counts by state")

    def handle(self, *args, **options):
        stats = queue_stats(groups=options["groups"])
        if options["json"]:
            self.stdout.write(json.dumps({"queues": stats}, indent=2))
            return
        columns = ["queue", *SHOWN_STATES, "in_flight", "oldest_ready_age", "dead_letters", "paused"]
        rows = [[_cell(row[c]) for c in columns] for row in stats]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        self.stdout.write("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
        for row in rows:
            self.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
        if not rows:
            self.stdout.write("(no queues yet)")
        for row in stats:
            for reason in row["held_back"]:
                self.stdout.write(f"{row['queue']} held back: {reason}")
            for key, counts in row.get("groups", {}).items():
                shown = ", ".join(f"{state} {n}" for state, n in counts.items() if n)
                self.stdout.write(f"{row['queue']} group {key!r}: {shown}")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}s"
    return str(value)
