"""Flow control for people: a rate written `N/PERIOD` (`100/1m`), and what holds a queue back right now.

The limits themselves live in the lease (engine/lease.py, sql.LOCK_FLOW_QUEUE and sql.LEASE_FAIR) and are set
through services.set_queue_options / configure_queue. Nothing here writes a row.

- rate limit: at most N leases (starts, retries included) per window of PERIOD, across all workers. Windows are
  aligned to the database clock (a 1m window starts on the minute), counted on the queue row under its lock.
- group limit: at most K items of one group key in flight (a live lease) at once.
- fair: the group keys of a queue take turns at each lease (weights give some keys more turns); a group limit
  implies it. Priority still comes first. Items queued without a key into such a queue share the group ''.
"""

import re
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count

from .engine.alias import connection
from .engine.sql import ITEM, QUEUE
from .models import QueueItem

PERIOD_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
RATE = re.compile(r"^(?P<limit>[+-]?\d+)/(?P<count>[+-]?\d*)(?P<unit>[smhd])$")
NO_LIMIT = ("none", "off")


def parse_rate(text: str) -> tuple[int | None, int | None]:
    """`100/1m` -> (100, 60): N leases per PERIOD (an optional count and a unit: s, m, h, d; `100/m` is
    `100/1m`). `none` or `off` -> (None, None): no rate limit. ValueError when it is not of that form; the
    numbers' ranges are checked by services.queue_option_errors (a zero limit or period is refused there)."""
    cleaned = text.strip().lower().replace(" ", "")
    if cleaned in NO_LIMIT:
        return None, None
    match = RATE.match(cleaned)
    if match is None:
        raise ValueError(f"a rate limit is N/PERIOD such as 100/1m, 10/30s or 5000/1h (units s, m, h, d), not {text!r}")
    count = int(match["count"]) if match["count"] else 1
    return int(match["limit"]), count * PERIOD_UNITS[match["unit"]]


def effective_priority(priority: int, aging_rate: float | None, state: str, due_at: datetime, now: datetime) -> float:
    """An item's priority as an aging lease ranks it (sql.LEASE_AGED): its own plus `aging_rate` points per second
    it has waited due (ready, or a lease that expired). The lease orders by due time less priority / rate, which
    ranks the items as this does at any moment."""
    if aging_rate is None or state not in ("ready", "reserved") or due_at > now:
        return float(priority)
    return priority + aging_rate * (now - due_at).total_seconds()


def format_rate(limit: int | None, period: int | None) -> str | None:
    """(100, 60) -> `100/1m`, in the largest unit the period is a whole number of."""
    if limit is None or period is None:
        return None
    for unit, seconds in sorted(PERIOD_UNITS.items(), key=lambda u: -u[1]):
        if period % seconds == 0:
            return f"{limit}/{period // seconds}{unit}"
    raise AssertionError("every whole number of seconds is a whole number of s")


# Per queue under a limit: its limits, what is in flight, the leases counted in the current rate window and when
# the next one starts, and whether a due ready item is waiting (only then is anything held back).
QUEUE_LIMITS = f"""
SELECT q.name, q.concurrency_limit, q.rate_limit, q.rate_period, q.group_concurrency,
       (SELECT count(*) FROM {ITEM} i WHERE i.queue_id = q.name AND i.state = 'reserved' AND i.visible_at > now()),
       CASE WHEN q.rate_window_start = w.start THEN q.rate_window_count ELSE 0 END,
       extract(epoch FROM w.start + make_interval(secs => q.rate_period) - now()),
       EXISTS (SELECT 1 FROM {ITEM} i WHERE i.queue_id = q.name AND i.state = 'ready' AND i.visible_at <= now())
FROM {QUEUE} q
CROSS JOIN LATERAL (SELECT to_timestamp(floor(extract(epoch FROM now()) / q.rate_period) * q.rate_period)) w(start)
WHERE NOT q.paused AND (q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL OR q.group_concurrency IS NOT NULL)
ORDER BY q.name
"""
# Group keys at their queue's group limit with a due ready item waiting: per group-limited queue, its rows in
# flight (item_in_flight), each key's waiting item found down item_group.
KEYS_AT_LIMIT = f"""
SELECT q.name, f.group_key, f.n
FROM {QUEUE} q
CROSS JOIN LATERAL (
    SELECT i.group_key, count(*) AS n FROM {ITEM} i
    WHERE i.queue_id = q.name AND i.state = 'reserved' AND i.visible_at > now()
    GROUP BY i.group_key
) f
WHERE NOT q.paused AND q.group_concurrency IS NOT NULL AND f.group_key IS NOT NULL AND f.n >= q.group_concurrency
  AND EXISTS (SELECT 1 FROM {ITEM} i WHERE i.queue_id = q.name AND i.group_key = f.group_key
              AND i.state IN ('ready', 'reserved') AND i.state = 'ready' AND i.visible_at <= now())
ORDER BY q.name, f.n DESC, f.group_key
"""
KEYS_SHOWN = 5


LIMITS = ("concurrency", "rate", "group")  # the limit label of /metrics' jobsite_queue_held_back


@dataclass(frozen=True, slots=True)
class HeldBack:
    """A queue under a limit, now: the limits it has, those keeping its due items waiting (and why, in words),
    and the counts behind them."""

    queue: str
    limits: tuple[str, ...]  # of LIMITS: the ones set on the queue
    holding: tuple[str, ...]  # of those, the ones keeping due items waiting now
    reasons: list[str]  # why, for people (the overview, queue_stats)
    keys_at_limit: list[str]  # group keys at the group limit with items waiting (all of them)
    in_flight: int  # items with a live lease
    rate_window_leases: int | None  # leases counted in the current rate window (None: no rate limit)

    def __str__(self) -> str:
        return "; ".join(self.reasons)


def limited_queues() -> list[HeldBack]:
    """Every queue under a limit (and not paused), whether held back now or not, by name."""
    with connection.cursor() as cur:
        cur.execute(QUEUE_LIMITS)
        queues = cur.fetchall()
        cur.execute(KEYS_AT_LIMIT)
        at_limit: dict[str, list[str]] = {}
        for queue, key, _ in cur.fetchall():
            at_limit.setdefault(queue, []).append(key)
    found = []
    for name, concurrency, rate, period, group_limit, in_flight, spent, next_in, waiting in queues:
        limits = tuple(
            limit for limit, value in zip(LIMITS, (concurrency, rate, group_limit), strict=True) if value is not None
        )
        reasons, holding = [], []
        if waiting and concurrency is not None and in_flight >= concurrency:
            holding.append("concurrency")
            reasons.append(f"concurrency limit: {in_flight} of {concurrency} in flight")
        if waiting and rate is not None and spent >= rate:
            holding.append("rate")
            rate_text = format_rate(rate, period)
            reasons.append(f"rate limit {rate_text}: {spent} leased in this window, next in {max(0, next_in):.0f} s")
        keys = at_limit.get(name, [])
        if keys:
            holding.append("group")
            shown = ", ".join(repr(k) for k in keys[:KEYS_SHOWN]) + (" ..." if len(keys) > KEYS_SHOWN else "")
            reasons.append(f"group limit {group_limit}: {len(keys)} key{'s' if len(keys) != 1 else ''} at it ({shown})")
        found.append(
            HeldBack(
                queue=name,
                limits=limits,
                holding=tuple(holding),
                reasons=reasons,
                keys_at_limit=keys,
                in_flight=in_flight,
                rate_window_leases=None if rate is None else spent,
            )
        )
    return found


def held_back() -> dict[str, HeldBack]:
    """{queue: why it is held back} for the queues whose due items wait on a limit (nothing for the others)."""
    return {state.queue: state for state in limited_queues() if state.holding}


def group_counts(queues: list[str] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """{queue: {group key: {state: count}}} over every item with a group key (an exact grouped count: for
    operators and scripts, like queue_stats)."""
    items = QueueItem.objects.order_by().filter(group_key__isnull=False)
    if queues is not None:
        items = items.filter(queue_id__in=queues)
    found: dict[str, dict[str, dict[str, int]]] = {}
    for row in items.values("queue_id", "group_key", "state").annotate(n=Count("id")):
        found.setdefault(row["queue_id"], {}).setdefault(row["group_key"], {})[row["state"]] = row["n"]
    return found
