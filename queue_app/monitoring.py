"""The queue's read side for people and machines: counts that stay cheap on millions of rows, and the snapshot that
the admin overview, `queue_stats` and /metrics (metrics.py) share; /healthz is health.py.

Nothing here writes a row. Counts are exact up to a cap and estimated beyond it (the planner's row estimate, or
pg_class.reltuples for a whole table), so no request ever counts a big table in full.
"""

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model, QuerySet
from django.utils import timezone

from .autoscaling import Signals, signals
from .conf import queue_settings
from .engine.alias import atomic, connection
from .models import HISTORY_STATES, HISTORY_STATES_SQL, ItemHistory, ItemState, Outcome, Worker, WorkerState

EXACT_UP_TO = 10_000  # queue depths above this are the planner's estimate (/metrics)
OVERVIEW_EXACT_UP_TO = 1_000  # the overview refreshes every few seconds: ~15 ms of counting at a million items


def worker_alive_within() -> timedelta:
    """A worker whose heartbeat is older is not counted as live (the same cutoff maintenance uses)."""
    return timedelta(seconds=queue_settings.WORKER_LOST_AFTER)


FAILED_OUTCOMES = (Outcome.RETRY, Outcome.DEAD, Outcome.TIMED_OUT)

# -- one vocabulary for an item's state: the admin's lists, filters and overview, queue_stats, /metrics ---------

# A ready item that is not due yet (a delay, or a retry's backoff) reads "scheduled"; "ready" means due now.
SCHEDULED = "scheduled"
SHOWN_STATES = (ItemState.READY.value, SCHEDULED, *(s.value for s in ItemState if s != ItemState.READY))


def shown_state(state: str, visible_at: datetime | None, now: datetime) -> str:
    """An item's state as people read it: its stored state, with a ready item not due yet read as scheduled (a
    ready item's visible_at is when a worker may take it)."""
    return SCHEDULED if state == ItemState.READY and visible_at is not None and visible_at > now else str(state)


# -- counting without COUNT(*) over a big table ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Count:
    """A row count that is either exact or the planner's estimate (beyond EXACT_UP_TO)."""

    value: int
    exact: bool = True

    def __str__(self) -> str:
        return f"{self.value:,}" if self.exact else f"≈ {self.value:,}"

    def __add__(self, other: "Count") -> "Count":
        return Count(self.value + other.value, self.exact and other.exact)


def table_estimate(model: type[Model]) -> int:
    """pg_class.reltuples of the model's table (kept by ANALYZE and autovacuum); -1 when never analyzed."""
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        row = cur.fetchone()
    return -1 if row is None else int(row[0])


def capped_count(queryset: QuerySet, cap: int, *, in_order: bool = False) -> int:
    """min(rows matching, cap): SELECT count(*) FROM (SELECT pk ... LIMIT cap), so it stops reading at the cap.
    Only the primary key: a list's annotations (LEFT(payload::text, 200)) would be computed per counted row.

    `in_order`: count the first `cap` rows in the queryset's own order (a change list's, newest first), so the
    count takes the path the page does. Unordered, the planner may read the table from its oldest end for rows
    that are all at the newest: "created in the last hour" over 10M items took 1.2-3 s (a sequential scan to
    the table's end), 10 ms walking the primary key from the newest."""
    return (queryset if in_order else queryset.order_by()).values("pk")[:cap].count()


def _explain_rows(sql: str, params: Iterable[Any]) -> int:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, list(params))
        plan = cur.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def planner_estimate(queryset: QuerySet) -> int:
    """The planner's estimate of the rows a queryset matches (EXPLAIN; nothing is read)."""
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    return _explain_rows(sql, params)


def archived_count(rows: QuerySet, cap: int = OVERVIEW_EXACT_UP_TO) -> Count:
    """Rows of a history table (what the archiver moved): exact up to `cap`, the planner's estimate beyond."""
    n = capped_count(rows, cap + 1)
    return Count(n) if n <= cap else Count(max(cap + 1, planner_estimate(rows)), exact=False)


def history_count(queue: str | None = None, state: str | None = None, cap: int = OVERVIEW_EXACT_UP_TO) -> Count:
    """Finished items the archiver moved to the history (of one queue, in one state): archived_count."""
    rows = ItemHistory.objects.all()
    if queue:
        rows = rows.filter(queue_id=queue)
    if state:
        rows = rows.filter(state=state)
    return archived_count(rows, cap)


# -- the snapshot: what the overview shows and /metrics exports -----------------------------------------------

ITEM = "queue_app_queueitem"
RESERVATION = "queue_app_reservation"
QUEUE = "queue_app_queue"
# The partitioned history (engine/history.py): finished items the archiver moved, counted with the hot ones.
ITEM_HISTORY = "queue_app_itemhistory"
RESERVATION_HISTORY = "queue_app_reservationhistory"

# Per queue and state, exact up to %(cap)s, each count an index scan that stops at the cap, so a queue with ten
# million done items costs as much as one with ten thousand: ready items are read down item_fetch in its order
# (the states in flight are few), reserved ones from item_in_flight, finished ones from item_history. Partial
# indexes, so each branch names states their predicates cover.
DEPTH = f"""
SELECT q.name, 'ready', (SELECT count(*) FROM (
    SELECT 1 FROM {ITEM} i WHERE i.queue_id = q.name AND i.state = 'ready' AND i.visible_at <= now()
    ORDER BY i.priority DESC, i.visible_at, i.id LIMIT %(cap)s) c)
FROM {QUEUE} q
UNION ALL
SELECT q.name, 'scheduled', (SELECT count(*) FROM (
    SELECT 1 FROM {ITEM} i WHERE i.queue_id = q.name AND i.state = 'ready' AND i.visible_at > now()
    ORDER BY i.priority DESC, i.visible_at, i.id LIMIT %(cap)s) c)
FROM {QUEUE} q
UNION ALL
SELECT q.name, 'reserved', (SELECT count(*) FROM (
    SELECT 1 FROM {ITEM} i WHERE i.queue_id = q.name AND i.state = 'reserved' LIMIT %(cap)s) c)
FROM {QUEUE} q
UNION ALL
SELECT q.name, s.state, hot.n + (SELECT count(*) FROM (
    -- the archived ones only up to the cap: a queue past it in the hot table reads no history at all
    SELECT 1 FROM {ITEM_HISTORY} h WHERE h.queue_id = q.name AND h.state = s.state
    LIMIT GREATEST(%(cap)s - hot.n, 0)) c)
FROM {QUEUE} q CROSS JOIN unnest(ARRAY[{HISTORY_STATES_SQL}]) AS s(state)
CROSS JOIN LATERAL (SELECT count(*) AS n FROM (
    SELECT 1 FROM {ITEM} i WHERE i.queue_id = q.name AND i.state IN ({HISTORY_STATES_SQL}) AND i.state = s.state
    LIMIT %(cap)s) c) hot
"""
DEPTH_ESTIMATE = f"SELECT 1 FROM {ITEM} WHERE queue_id = %s AND state = %s"
DEPTH_ESTIMATE_READY = {  # a ready item's visible_at is its due time (run_at)
    "ready": f"SELECT 1 FROM {ITEM} WHERE queue_id = %s AND state = 'ready' AND visible_at <= now()",
    SCHEDULED: f"SELECT 1 FROM {ITEM} WHERE queue_id = %s AND state = 'ready' AND visible_at > now()",
}
DEPTH_ESTIMATE_HISTORY = f"SELECT 1 FROM {ITEM_HISTORY} WHERE queue_id = %s AND state = %s"

# Per queue: paused, and what workers hold with a live lease (exact up to %(cap)s).
QUEUE_HEADS = f"""
SELECT q.name, q.paused,
       (SELECT count(*) FROM (SELECT 1 FROM {ITEM} i
                              WHERE i.queue_id = q.name AND i.state = 'reserved' AND i.visible_at > now()
                              LIMIT %(cap)s) c)
FROM {QUEUE} q
ORDER BY q.name
"""

# How long each queue's longest-waiting due item has waited, without reading every active row: walk the
# distinct priorities of the queue's active rows down item_fetch (queue, priority DESC, visible_at, id), then
# take the first due ready row of each priority in visible_at order. A few index probes per priority level,
# where min(visible_at) over the active rows reads all of them (~0.7 s for 150,000 ready items).
OLDEST_READY = f"""
WITH RECURSIVE p(queue, priority) AS (
    SELECT q.name, (SELECT max(i.priority) FROM {ITEM} i
                    WHERE i.queue_id = q.name AND i.state IN ('ready', 'reserved'))
    FROM {QUEUE} q
    UNION ALL
    SELECT p.queue, (SELECT max(i.priority) FROM {ITEM} i
                     WHERE i.queue_id = p.queue AND i.state IN ('ready', 'reserved') AND i.priority < p.priority)
    FROM p WHERE p.priority IS NOT NULL
)
SELECT p.queue, extract(epoch FROM now() - min(o.visible_at))
FROM p CROSS JOIN LATERAL (
    SELECT i.visible_at FROM {ITEM} i
    WHERE i.queue_id = p.queue AND i.state IN ('ready', 'reserved') AND i.priority = p.priority
      AND i.visible_at <= now() AND i.state = 'ready'
    ORDER BY i.visible_at
    LIMIT 1
) o
GROUP BY p.queue
"""

# Attempts that ended in the last %(minutes)s minutes, per queue, outcome and minute (0 = the last 60 s). Done
# attempts are counted from their items (an item is done by exactly one attempt, in the same statement; per
# queue down item_history), the others from reservation_not_done: no index on the reservation's finished_at or
# outcome, so that the done settle is a HOT update (models.Reservation.not_done_at).
RECENT_ATTEMPTS = f"""
SELECT q.name, 'done', floor(extract(epoch FROM now() - d.finished_at) / 60)::int, count(*)
FROM {QUEUE} q CROSS JOIN LATERAL (
    SELECT i.finished_at FROM {ITEM} i
    WHERE i.state = 'done' AND i.queue_id = q.name AND i.finished_at > now() - make_interval(mins => %(minutes)s)
) d
GROUP BY 1, 2, 3
UNION ALL
SELECT q.name, 'done', floor(extract(epoch FROM now() - d.finished_at) / 60)::int, count(*)
FROM {QUEUE} q CROSS JOIN LATERAL (
    SELECT h.finished_at FROM {ITEM_HISTORY} h
    WHERE h.queue_id = q.name AND h.state = 'done' AND h.finished_at > now() - make_interval(mins => %(minutes)s)
) d
GROUP BY 1, 2, 3
UNION ALL
SELECT i.queue_id, r.outcome, floor(extract(epoch FROM now() - r.not_done_at) / 60)::int, count(*)
FROM {RESERVATION} r JOIN {ITEM} i ON i.id = r.item_id
WHERE r.not_done_at > now() - make_interval(mins => %(minutes)s)
GROUP BY 1, 2, 3
UNION ALL
SELECT h.queue_id, r.outcome, floor(extract(epoch FROM now() - r.not_done_at) / 60)::int, count(*)
FROM {RESERVATION_HISTORY} r JOIN {ITEM_HISTORY} h ON h.id = r.item_id AND h.finished_at = r.item_finished_at
WHERE r.not_done_at > now() - make_interval(mins => %(minutes)s)
GROUP BY 1, 2, 3
"""


@dataclass(frozen=True, slots=True)
class QueueStats:
    name: str
    paused: bool
    depth: dict[str, Count]  # by shown state (SHOWN_STATES: ready = due now, scheduled = due later)
    oldest_ready_age: float | None  # seconds the longest-waiting due item has waited; None: nothing due
    in_flight: Count  # reserved with a live lease
    processed: int  # attempts done within the window
    failed: int  # attempts failed (retry, dead, timed out) within the window
    lease_expirations: int  # attempts whose lease ran out within the window
    workers: int  # live workers serving this queue
    autoscale: Signals  # throughput per worker and a suggested worker count (queue_app/autoscaling.py)

    @property
    def dead_letters(self) -> Count:
        return self.depth[ItemState.DEAD]


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: datetime
    window_minutes: int
    queues: list[QueueStats]
    workers: list[Worker]  # live ones
    processed_per_minute: list[int] = field(default_factory=list)  # oldest minute first
    failed_per_minute: list[int] = field(default_factory=list)

    @property
    def processed(self) -> int:
        return sum(self.processed_per_minute)

    @property
    def failed(self) -> int:
        return sum(self.failed_per_minute)


def live_workers() -> list[Worker]:
    return list(
        Worker.objects.filter(
            last_heartbeat__gte=timezone.now() - worker_alive_within(),
            state__in=[WorkerState.RUNNING, WorkerState.STOPPING],
        ).order_by("id")
    )


def serves(worker: Worker, queue: str) -> bool:
    """A worker with no queue list (or "*") serves every queue."""
    names = worker.queues or ["*"]
    return "*" in names or queue in names


def _depths(cur: Any, cap: int) -> dict[tuple[str, str], Count]:
    cur.execute(DEPTH, {"cap": cap + 1})
    depth = {}
    for queue, state, n in cur.fetchall():
        if n > cap:
            if state in DEPTH_ESTIMATE_READY:
                estimate = _explain_rows(DEPTH_ESTIMATE_READY[state], [queue])
            else:
                estimate = _explain_rows(DEPTH_ESTIMATE, [queue, state])
            if state in HISTORY_STATES:
                estimate += _explain_rows(DEPTH_ESTIMATE_HISTORY, [queue, state])
            depth[queue, state] = Count(max(cap + 1, estimate), exact=False)
        else:
            depth[queue, state] = Count(n)
    return depth


def snapshot(window_minutes: int = 15, cap: int = EXACT_UP_TO) -> Snapshot:
    """Every queue's depth by state, oldest due item, in-flight, outcomes over the last `window_minutes`,
    and the live workers: five statements whatever the table sizes (see the SQL above), plus an EXPLAIN per
    depth past the cap."""
    with atomic(), connection.cursor() as cur:
        # These statements are many cheap index probes that the planner prices high (a recursive CTE, one
        # subquery per queue and state): JIT would compile them for ~1 s to save nothing.
        cur.execute("SET LOCAL jit = off")
        depth = _depths(cur, cap)
        cur.execute(QUEUE_HEADS, {"cap": cap + 1})
        heads = cur.fetchall()
        cur.execute(OLDEST_READY)
        oldest = dict(cur.fetchall())
        cur.execute(RECENT_ATTEMPTS, {"minutes": window_minutes})
        recent = cur.fetchall()
    outcomes: dict[tuple[str, str], int] = defaultdict(int)
    processed_per_minute = [0] * window_minutes
    failed_per_minute = [0] * window_minutes
    for queue, outcome, minute, n in recent:
        outcomes[queue, outcome] += n
        slot = window_minutes - 1 - min(max(minute, 0), window_minutes - 1)
        if outcome == Outcome.DONE:
            processed_per_minute[slot] += n
        elif outcome in FAILED_OUTCOMES:
            failed_per_minute[slot] += n
    workers = live_workers()
    queues = []
    for name, paused, in_flight in heads:
        serving = sum(serves(w, name) for w in workers)
        ready = depth.get((name, ItemState.READY.value), Count(0))
        queues.append(
            QueueStats(
                name=name,
                paused=paused,
                depth={state: depth.get((name, state), Count(0)) for state in SHOWN_STATES},
                oldest_ready_age=None if oldest.get(name) is None else max(0.0, float(oldest[name])),
                in_flight=Count(in_flight) if in_flight <= cap else Count(cap + 1, exact=False),
                processed=outcomes[name, Outcome.DONE],
                failed=sum(outcomes[name, o] for o in FAILED_OUTCOMES),
                lease_expirations=outcomes[name, Outcome.EXPIRED],
                workers=serving,
                autoscale=signals(
                    ready=ready.value,
                    in_flight=in_flight,
                    paused=paused,
                    completed=outcomes[name, Outcome.DONE],
                    window_seconds=window_minutes * 60,
                    workers=serving,
                ),
            )
        )
    return Snapshot(
        taken_at=timezone.now(),
        window_minutes=window_minutes,
        queues=queues,
        workers=workers,
        processed_per_minute=processed_per_minute,
        failed_per_minute=failed_per_minute,
    )


METRICS_WINDOW_MINUTES = 5  # the window of /metrics' recent figures (metrics.py) and `queue_stats --json`
