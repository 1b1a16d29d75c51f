"""One function per state change outside the hot path: requeue, retry now, cancel, pause, resume, purge.

The admin, the dashboard, the CLI and the worker call these and never write queue rows themselves (Zulip's
`do_*` actions). Each returns how many rows it changed, so callers can report counts; ids in a state the action
does not apply to are left alone and not counted.
"""

import math
from collections.abc import Iterable
from datetime import timedelta

from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils.duration import duration_string

from . import events, hooks
from .conf import queue_settings
from .engine import history, tracing
from .engine.alias import atomic
from .engine.db import cursor
from .engine.enqueue import QUEUE_NAME, ensure_queue, is_group_key
from .engine.sql import NOTIFY
from .models import DeadLetter, ItemState, Outcome, Queue, QueueItem, Reservation
from .registry import item_defaults

REQUEUEABLE = (ItemState.DEAD, ItemState.CANCELLED)
CANCELLABLE = (ItemState.READY, ItemState.RESERVED)
MAX_RATE_PERIOD = 30 * 86_400  # seconds: a month
MAX_GROUP_WEIGHTS = 1_000
MAX_GROUP_WEIGHT = 1_000


def _notify(queues: Iterable[str]) -> None:
    with cursor() as cur:
        for queue in set(queues):
            cur.execute(NOTIFY, {"channel": queue_settings.NOTIFY_CHANNEL, "queue": queue})


REQUEUE_SPANS = 1_000  # with tracing on, the most requeue spans one requeue makes (the first items')


@atomic
def requeue_items(item_ids: Iterable[int], *, actor: str = "") -> int:
    """Dead or cancelled items go back to ready with their attempts reset; their attempt history stays and
    their open dead letters are marked requeued (by `actor`). An archived item (engine/history.py) first moves
    back into the hot tables with its reservations."""
    wanted = list(item_ids)
    hot = QueueItem.objects.select_for_update().filter(state__in=REQUEUEABLE).values_list("id", "queue_id", "task")
    locked = list(hot.filter(id__in=wanted))
    # After the hot rows' locks: an archiver that held one has committed its move, so the row is found here.
    restored = history.restore(sorted(set(wanted) - {item_id for item_id, _, _ in locked}))
    if restored:
        locked += hot.filter(id__in=restored)
    if not locked:
        return 0
    ids = [item_id for item_id, _, _ in locked]
    # Their attempts as their task declares them now (registry.item_defaults, as every new item gets them):
    # an item queued with another count (by hand, or before its task changed) comes back with the declared one.
    by_task: dict[str, list[int]] = {}
    for item_id, _, task in locked:
        by_task.setdefault(task, []).append(item_id)
    for task, task_ids in by_task.items():
        declared = (item_defaults(task) or {}).get("max_attempts")
        if declared is not None:
            QueueItem.objects.filter(id__in=task_ids).exclude(max_attempts=declared).update(max_attempts=declared)
    QueueItem.objects.filter(id__in=ids).update(
        state=ItemState.READY,
        debounce_key=None,  # runs as itself: a cancelled item's key may have a newer ready item (item_debounce_ready)
        attempts=0,
        run_at=Now(),
        visible_at=Now(),
        finished_at=None,
        error="",
        updated_at=Now(),
    )
    DeadLetter.objects.filter(item_id__in=ids, requeued_at__isnull=True).update(
        requeued_at=Now(), requeued_by=actor[:150]
    )
    _group_ungrouped_items(Queue.objects.filter(GROUPED, name__in={q for _, q, _ in locked}), ids)
    _notify(queue for _, queue, _ in locked)
    if tracing.enabled:  # a `requeue` event under each item's enqueue, a sibling of its attempts
        traced = QueueItem.objects.filter(id__in=ids, trace_context__isnull=False)
        for item_id, task, context in traced.values_list("id", "task", "trace_context")[:REQUEUE_SPANS]:
            tracing.event_span(
                f"requeue {task}", context, "requeue", **{"jobsite.item_id": item_id, "jobsite.actor": actor[:150]}
            )
    return len(ids)


def requeue_dead_letters(dead_letter_ids: Iterable[int], *, actor: str = "") -> int:
    """Requeue the items of these dead letters (those not requeued already)."""
    item_ids = DeadLetter.objects.filter(id__in=list(dead_letter_ids), requeued_at__isnull=True).values_list(
        "item_id", flat=True
    )
    return requeue_items(list(item_ids), actor=actor)


@atomic
def retry_now(item_ids: Iterable[int]) -> int:
    """Ready items waiting for their run time or backoff become due now."""
    locked = list(
        QueueItem.objects.select_for_update()
        .filter(id__in=list(item_ids), state=ItemState.READY, visible_at__gt=Now())
        .values_list("id", "queue_id")
    )
    if not locked:
        return 0
    QueueItem.objects.filter(id__in=[i for i, _ in locked]).update(run_at=Now(), visible_at=Now(), updated_at=Now())
    _notify(queue for _, queue in locked)
    return len(locked)


@atomic
def cancel_items(item_ids: Iterable[int], *, actor: str = "") -> int:
    """Ready or reserved items become cancelled. A worker holding one finds its reservation stale: its settle
    changes nothing, and its heartbeat tells it to stop the handler.

    A layer whose rows ride on items cancels them first, through the `cancel_requested` hook (hooks.py): the item
    of an open Spark run is cancelled as its run (spark/cancel.py), and an item whose handler will stop and settle
    it itself is left to that handler. Counted: the items cancelled here and the cancels asked of handlers."""
    ids = list(item_ids)
    asked, stopped_by_handler = 0, set()
    for cancel_rows in hooks.cancel_requested:
        layer_asked, kept = cancel_rows(ids, actor)
        asked += layer_asked
        stopped_by_handler |= kept
    locked = list(
        QueueItem.objects.select_for_update()
        .filter(id__in=[i for i in ids if i not in stopped_by_handler], state__in=CANCELLABLE)
        .values_list("id", "state", "reservation_id")
    )
    if not locked:
        return asked
    _mark_cancelled(locked, f"cancelled by {actor}" if actor else "cancelled")
    return asked + len(locked)


def _mark_cancelled(locked: list[tuple[int, str, int | None]], error: str) -> None:
    """Items (id, state, reservation id) locked by the caller become cancelled, with their open reservation."""
    QueueItem.objects.filter(id__in=[i for i, _, _ in locked]).update(
        state=ItemState.CANCELLED, finished_at=Now(), error=error, updated_at=Now()
    )
    held = [rid for _, state, rid in locked if state == ItemState.RESERVED and rid is not None]
    Reservation.objects.filter(id__in=held, outcome__isnull=True).update(outcome=Outcome.CANCELLED, finished_at=Now())


def settle_cancelled_run_item(item_id: int, reservation_id: int, error: str) -> bool:
    """The handler of a Spark run that was cancelled settles its own item `cancelled` (not done), inside the
    transaction that marks the run cancelled, fenced on its reservation. The worker's later complete of that
    reservation then finds it no longer current and changes nothing."""
    locked = list(
        QueueItem.objects.select_for_update()
        .filter(id=item_id, reservation_id=reservation_id, state=ItemState.RESERVED)
        .values_list("id", "state", "reservation_id")
    )
    _mark_cancelled(locked, error)
    return bool(locked)


@atomic
def pause_queue(name: str, *, actor: str = "") -> int:
    """Stop workers leasing from the queue; items in flight finish normally."""
    changed = Queue.objects.filter(name=name, paused=False).update(paused=True)
    if changed:
        events.publish("queue.paused", {"queue": name, "by": actor})
    return changed


@atomic
def resume_queue(name: str, *, actor: str = "") -> int:
    changed = Queue.objects.filter(name=name, paused=True).update(paused=False)
    if changed:
        _notify([name])
        events.publish("queue.resumed", {"queue": name, "by": actor})
    return changed


@atomic
def purge_dead_letters(older_than: timedelta) -> int:
    """Delete items that have been dead for longer than `older_than`, with their dead letters and history."""
    doomed = QueueItem.objects.filter(state=ItemState.DEAD, finished_at__lt=Now() - older_than).values_list(
        "id", flat=True
    )
    deleted, _ = QueueItem.objects.filter(id__in=list(doomed)).delete()
    return deleted


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_limit(value: object) -> bool:
    """None (no limit) or an integer >= 1."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_LIMIT)


MAX_LIMIT = 2_147_483_647  # the columns are PostgreSQL integers


def is_group_weight(value: object) -> bool:
    """A group key's turns per round: a number above 0, at most MAX_GROUP_WEIGHT."""
    return _is_number(value) and 0 < value <= MAX_GROUP_WEIGHT


def _are_weights(value: object) -> bool:
    return value is None or (
        isinstance(value, dict)
        and len(value) <= MAX_GROUP_WEIGHTS
        and all(is_group_key(k) and is_group_weight(w) for k, w in value.items())
    )


# Priority aging: at most this many priority points per second (the whole range, -100..100, in 0.2 ms).
MAX_AGING_RATE = 1_000_000

QUEUE_OPTION_RULES = {
    # option: (is the value acceptable?, what it must be)
    "concurrency_limit": (_is_limit, "an integer >= 1, or empty for no limit (pause the queue to stop it)"),
    "lease_timeout": (lambda v: _is_number(v) and v > 0, "a finite number of seconds > 0"),
    "max_attempts": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "retention": (
        lambda v: isinstance(v, timedelta) and v >= timedelta(0),
        'a duration >= 0, as days hh:mm:ss ("7 00:00:00" is a week)',
    ),
    "rate_limit": (_is_limit, "an integer >= 1 (leases per rate period), or empty for no limit"),
    "rate_period": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_RATE_PERIOD),
        f"an integer number of seconds from 1 to {MAX_RATE_PERIOD}, or empty with no rate limit",
    ),
    "group_concurrency": (_is_limit, "an integer >= 1 (items of one group key in flight), or empty for no limit"),
    "fair": (lambda v: isinstance(v, bool), "true or false"),
    "group_weights": (
        _are_weights,
        f"an object of at most {MAX_GROUP_WEIGHTS} group keys (each a group key) to weights from 0 (excluded) to"
        f" {MAX_GROUP_WEIGHT}, or empty",
    ),
    "aging_rate": (
        lambda v: v is None or (_is_number(v) and 0 < v <= MAX_AGING_RATE),
        f"a number of priority points per second above 0 and at most {MAX_AGING_RATE}, or empty for no aging",
    ),
}


def _shown(value: object) -> str:
    """A refused value as the person who typed it would write it: a duration as days hh:mm:ss, not as Python."""
    if isinstance(value, timedelta):
        return duration_string(value)
    return repr(value)


def queue_option_errors(**options: object) -> dict[str, str]:
    """{option: what is wrong} for the options a queue cannot run with (a zero lease, no attempts, a negative
    retention, a rate limit without its period...); empty when all are fine. The admin's queue form shows these
    per field. A rate limit and its period are set together: give both (None and None lifts the limit)."""
    errors = {}
    for name, value in options.items():
        rule = QUEUE_OPTION_RULES.get(name)
        if rule is None:
            errors[name] = f"unknown queue option; allowed: {', '.join(sorted(QUEUE_OPTION_RULES))}"
        elif not rule[0](value):
            errors[name] = f"must be {rule[1]}, not {_shown(value)}"
    if "rate_limit" in options or "rate_period" in options:
        limit, period = options.get("rate_limit"), options.get("rate_period")
        if (limit is None) != (period is None) and not errors.keys() & {"rate_limit", "rate_period"}:
            missing = "rate_period" if period is None else "rate_limit"
            errors[missing] = "must be given with the other: a rate limit is N leases per period of seconds"
    return errors


@atomic
def set_queue_options(name: str, **options: object) -> int:
    """Change a queue's settings (concurrency_limit, lease_timeout, max_attempts, retention, and flow control:
    rate_limit with rate_period, group_concurrency, fair, group_weights; priority aging: aging_rate); ValueError
    naming every bad option (nothing changed) if any is unknown or out of range.

    A queue that starts leasing by group key (fair, or a group limit) puts its open items queued without a key
    into the group '' (engine enqueues do the same from then on): the fair lease reads groups only."""
    errors = queue_option_errors(**options)
    if errors:
        unknown = sorted(n for n in errors if n not in QUEUE_OPTION_RULES)
        if unknown:
            allowed = ", ".join(sorted(QUEUE_OPTION_RULES))
            raise ValueError(f"unknown queue options: {', '.join(unknown)}; allowed: {allowed}")
        raise ValueError("; ".join(f"{n} {message}" for n, message in errors.items()))
    if "rate_limit" in options or "rate_period" in options:  # a new limit starts a new count
        options.update(rate_window_start=None, rate_window_count=None)
    if options.keys() & {"fair", "group_concurrency"}:
        # Wait for the enqueues that read the queue ungrouped (they hold its row FOR KEY SHARE until they
        # commit: sql._GROUP_KEY) and hold later ones back until this commits, so no item is left without a group.
        list(Queue.objects.select_for_update().filter(name=name).values_list("name"))
    changed = Queue.objects.filter(name=name).update(**options)
    # The fair lease orders each group key's lane by priority (sql.LEASE_FAIR); an aging rate there would be a
    # setting with no effect. Raised inside the transaction: nothing is changed.
    aging_options = {"fair", "group_concurrency", "aging_rate"}
    if (
        changed
        and options.keys() & aging_options
        and Queue.objects.filter(GROUPED, name=name, aging_rate__isnull=False).exists()
    ):
        raise ValueError(
            "aging_rate cannot be combined with fair leasing or a group limit (group_concurrency): the fair "
            "lease takes each group key's items by priority"
        )
    if changed and options.keys() & {"fair", "group_concurrency"}:
        _group_ungrouped_items(Queue.objects.filter(GROUPED, name=name))
    return changed


# A queue that leases by group key (sql._GROUPED).
GROUPED = Q(fair=True) | Q(group_concurrency__isnull=False)


def _group_ungrouped_items(queues: QuerySet[Queue], item_ids: list[int] | None = None) -> None:
    """Open items without a group key in these queues join the group '' (see set_queue_options)."""
    items = QueueItem.objects.filter(queue__in=queues, state__in=CANCELLABLE, group_key__isnull=True)
    if item_ids is not None:
        items = items.filter(id__in=item_ids)
    items.update(group_key="", updated_at=Now())


def configure_queue(name: str, **options: object) -> tuple[bool, int]:
    """Create the queue (with the defaults an enqueue gives it) if it does not exist, then set `options` through
    set_queue_options, in one transaction: a bad name or option writes nothing. Returns (created, changed)."""
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise ValueError(f"queue name must match {QUEUE_NAME.pattern}, not {name!r}")
    errors = queue_option_errors(**options)
    if errors:
        set_queue_options(name, **options)  # raises, naming every bad option
    with atomic():
        created = not Queue.objects.filter(name=name).exists()
        ensure_queue(name)
        changed = set_queue_options(name, **options) if options else 0
    return created, changed


__all__ = [
    "cancel_items",
    "configure_queue",
    "pause_queue",
    "purge_dead_letters",
    "queue_option_errors",
    "requeue_dead_letters",
    "requeue_items",
    "resume_queue",
    "retry_now",
    "set_queue_options",
]
