"""/metrics: the queue's figures in Prometheus' text format (prometheus_client), from the snapshot the admin
overview shares (monitoring.snapshot), what holds the limited queues back (flow.limited_queues), and each layer
app's collector (hooks.metric_collectors). Imported by the URLconf only: a project's start does not load
prometheus_client.
"""

from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import hooks
from .engine import tracing
from .flow import HeldBack, limited_queues
from .monitoring import EXACT_UP_TO, METRICS_WINDOW_MINUTES, Snapshot, snapshot


class SnapshotCollector:
    """Exposes one Snapshot, and what holds the limited queues back (flow.limited_queues), in Prometheus' text
    format (a fresh registry per scrape; nothing is cached)."""

    def __init__(self, snap: Snapshot, limited: Iterable[HeldBack] = ()) -> None:
        self.snap = snap
        self.limited = list(limited)

    def collect(self) -> Iterable[Any]:
        snap = self.snap
        window = f"the last {snap.window_minutes * 60} s"
        depth = GaugeMetricFamily(
            "jobsite_queue_depth",
            f"Items per queue and state (exact up to {EXACT_UP_TO}, the planner's estimate above); ready = due "
            "now, scheduled = ready but due later (a delay or a retry's backoff).",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "jobsite_queue_oldest_ready_age_seconds",
            "How long the longest-waiting due ready item has waited (0 when none is due).",
            labels=["queue"],
        )
        gauges = {
            "in_flight": ("Items reserved by a worker with a live lease.", lambda q: q.in_flight.value),
            "paused": ("1 when the queue is paused.", lambda q: int(q.paused)),
            "dead_letters": ("Dead items waiting for a requeue or purge.", lambda q: q.dead_letters.value),
            "processed_recent": (f"Attempts completed in {window}.", lambda q: q.processed),
            "failed_recent": (f"Attempts failed (retry, dead, timed out) in {window}.", lambda q: q.failed),
            "lease_expirations_recent": (f"Leases that ran out in {window}.", lambda q: q.lease_expirations),
            "workers_alive": ("Live workers serving the queue.", lambda q: q.workers),
            "suggested_workers": (
                "Workers that would drain the queue's ready and in-flight items within AUTOSCALE_TARGET_DRAIN_SECONDS "
                f"at the throughput per worker of {window} (at least 1 while there is work, at most "
                "AUTOSCALE_MAX_WORKERS; 0 when there is none). For an autoscaler: docs/how-to/autoscaling.md.",
                lambda q: q.autoscale.suggested_workers,
            ),
        }
        families = {
            name: GaugeMetricFamily(f"jobsite_queue_{name}", help_text, labels=["queue"])
            for name, (help_text, _) in gauges.items()
        }
        per_worker = GaugeMetricFamily(
            "jobsite_queue_throughput_per_worker",
            f"Items per second each live worker serving the queue completed in {window} (no sample while unknown: "
            "nothing completed, or no live worker).",
            labels=["queue"],
        )
        for q in snap.queues:
            for state, count in q.depth.items():
                depth.add_metric([q.name, state], count.value)
            oldest.add_metric([q.name], q.oldest_ready_age or 0.0)
            for name, (_, value) in gauges.items():
                families[name].add_metric([q.name], value(q))
            if q.autoscale.throughput_per_worker is not None:
                per_worker.add_metric([q.name], q.autoscale.throughput_per_worker)
        yield depth
        yield oldest
        yield from families.values()
        yield per_worker
        yield from self.held_back()
        yield GaugeMetricFamily("jobsite_workers_alive", "Workers with a recent heartbeat.", value=len(snap.workers))
        if tracing.enabled:
            yield CounterMetricFamily(
                "jobsite_spans_dropped",
                "Trace spans this process (the one serving /metrics) dropped: export queue full or collector failed.",
                value=tracing.dropped(),
            )
        # Counters need a monotonic source: each worker keeps its own in its row's stats while it lives.
        for key, help_text in (
            ("processed", "Items the worker completed."),
            ("failed", "Attempts that failed."),
            ("events_dropped", "Workflow events no wait claimed, dropped by the worker past their lookback."),
            (
                "handed_off",
                "Items the worker started from a hand-off: leased by their own enqueue, no lease statement.",
            ),
            ("spans_dropped", "Trace spans the worker dropped: its export queue was full or the collector failed."),
        ):
            counter = CounterMetricFamily(f"jobsite_worker_{key}", help_text, labels=["worker"])
            for worker in snap.workers:
                value = (worker.stats or {}).get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    counter.add_metric([worker.id], value)
            yield counter
        # How each worker learns of new items: listen (LISTEN/NOTIFY, polling as the fallback) or poll (behind a
        # transaction pooler without LISTEN_DATABASE_URL: new items wait up to its poll interval).
        wakeup = GaugeMetricFamily(
            "jobsite_worker_wakeup",
            "1 for the worker's wake-up mode: listen (LISTEN/NOTIFY) or poll (behind a transaction pooler without "
            "LISTEN_DATABASE_URL).",
            labels=["worker", "mode"],
        )
        poll = GaugeMetricFamily(
            "jobsite_worker_poll_interval_seconds",
            "Seconds between the worker's polls: how long a new item may wait for a worker in poll mode.",
            labels=["worker"],
        )
        for worker in snap.workers:
            info = worker.stats or {}
            if info.get("wakeup") in ("listen", "poll"):
                wakeup.add_metric([worker.id, info["wakeup"]], 1)
            if isinstance(info.get("poll_interval"), int | float):
                poll.add_metric([worker.id], info["poll_interval"])
        yield wakeup
        yield poll

    def held_back(self) -> Iterable[Any]:
        """The overview's "Held back" column as numbers: per limit a queue has, 1 while it keeps due items
        waiting; the group keys at their limit; the leases counted in the current rate window."""
        held = GaugeMetricFamily(
            "jobsite_queue_held_back",
            "1 while this limit of the queue keeps due items waiting, else 0 (one sample per limit set: "
            "concurrency, rate, group).",
            labels=["queue", "limit"],
        )
        keys = GaugeMetricFamily(
            "jobsite_queue_group_keys_at_limit",
            "Group keys at the queue's group limit with due items waiting.",
            labels=["queue"],
        )
        spent = GaugeMetricFamily(
            "jobsite_queue_rate_window_leases",
            "Leases counted in the queue's current rate-limit window.",
            labels=["queue"],
        )
        for state in self.limited:
            for limit in state.limits:
                held.add_metric([state.queue, limit], int(limit in state.holding))
            if "group" in state.limits:
                keys.add_metric([state.queue], len(state.keys_at_limit))
            if state.rate_window_leases is not None:
                spent.add_metric([state.queue], state.rate_window_leases)
        yield from (held, keys, spent)


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        snap = snapshot(window_minutes=METRICS_WINDOW_MINUTES)
        limited = limited_queues()
        layers = [collector() for collector in hooks.metric_collectors]  # the layer apps' figures (hooks.py)
    except DatabaseError as exc:
        return HttpResponse(f"database unavailable: {exc}\n", status=503, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap, limited))
    for collector in layers:
        registry.register(collector)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
