"""One function per state change outside the hot path: requeue, retry now, cancel, pause, resume, purge.

The admin, the dashboard, the CLI and the worker call these and never write queue rows themselves (Zulip's
`do_*` actions). Each returns how many rows it changed, so callers can report counts; ids in a state the action
does not apply to are left alone and not counted.
"""

import math
from collections.abc import Iterable
from datetime import timedelta

from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from .conf import queue_settings
from .engine.db import cursor
from .engine.sql import NOTIFY
from .models import (
    SPARK_OPEN_STATES,
    DeadLetter,
    ItemState,
    Outcome,
    Queue,
    QueueItem,
    Reservation,
    SparkRun,
    SparkRunState,
)

REQUEUEABLE = (ItemState.DEAD, ItemState.CANCELLED)
CANCELLABLE = (ItemState.READY, ItemState.RESERVED)


def _notify(queues: Iterable[str]) -> None:
    with cursor() as cur:
        for queue in set(queues):
            cur.execute(NOTIFY, {"channel": queue_settings.NOTIFY_CHANNEL, "queue": queue})


@transaction.atomic
def requeue_items(item_ids: Iterable[int], *, actor: str = "") -> int:
    """Dead or cancelled items go back to ready with their attempts reset; their attempt history stays and
    their open dead letters are marked requeued (by `actor`)."""
    locked = list(
        QueueItem.objects.select_for_update()
        .filter(id__in=list(item_ids), state__in=REQUEUEABLE)
        .values_list("id", "queue_id")
    )
    if not locked:
        return 0
    ids = [item_id for item_id, _ in locked]
    QueueItem.objects.filter(id__in=ids).update(
        state=ItemState.READY,
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
    _notify(queue for _, queue in locked)
    return len(ids)


def requeue_dead_letters(dead_letter_ids: Iterable[int], *, actor: str = "") -> int:
    """Requeue the items of these dead letters (those not requeued already)."""
    item_ids = DeadLetter.objects.filter(id__in=list(dead_letter_ids), requeued_at__isnull=True).values_list(
        "item_id", flat=True
    )
    return requeue_items(list(item_ids), actor=actor)


@transaction.atomic
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


@transaction.atomic
def cancel_items(item_ids: Iterable[int], *, actor: str = "") -> int:
    """Ready or reserved items become cancelled. A worker holding one finds its reservation stale: its settle
    changes nothing, and its heartbeat tells it to stop the handler.

    The item of an open Spark run is cancelled as its run (the dashboard's cancel calls this too): a run not
    started yet is cancelled with its item; a started one goes to `cancelling` and keeps its item, whose handler
    stops the spark-submit child (SIGTERM to its process group, SIGKILL after the grace), marks the run
    cancelled and settles the item. Cancelling that item outright would have the worker kill the handler and
    leave the run's row `running`. A run already `cancelling` is not counted again."""
    ids = list(item_ids)
    runs = list(
        SparkRun.objects.select_for_update()  # run rows before item rows, as the Spark handler locks them
        .filter(item_id__in=ids, state__in=SPARK_OPEN_STATES)
        .order_by("id")
    )
    now = timezone.now()
    asked = 0
    for run in runs:
        if run.state == SparkRunState.QUEUED:  # no child yet: the handler claims the row under its lock first
            run.state, run.finished_at = SparkRunState.CANCELLED, now
            run.error = f"cancelled by {actor} before it started" if actor else "cancelled before it started"
        elif run.state != SparkRunState.CANCELLING:
            run.state = SparkRunState.CANCELLING
            asked += 1
        run.cancel_requested_at = run.cancel_requested_at or now
        run.save(update_fields=["state", "finished_at", "error", "cancel_requested_at"])
    stopped_by_handler = {run.item_id for run in runs if run.state == SparkRunState.CANCELLING}
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


def pause_queue(name: str) -> int:
    """Stop workers leasing from the queue; items in flight finish normally."""
    return Queue.objects.filter(name=name, paused=False).update(paused=True)


def resume_queue(name: str) -> int:
    changed = Queue.objects.filter(name=name, paused=True).update(paused=False)
    if changed:
        _notify([name])
    return changed


@transaction.atomic
def purge_dead_letters(older_than: timedelta) -> int:
    """Delete items that have been dead for longer than `older_than`, with their dead letters and history."""
    doomed = QueueItem.objects.filter(state=ItemState.DEAD, finished_at__lt=Now() - older_than).values_list(
        "id", flat=True
    )
    deleted, _ = QueueItem.objects.filter(id__in=list(doomed)).delete()
    return deleted


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


QUEUE_OPTION_RULES = {
    # option: (is the value acceptable?, what it must be)
    "concurrency_limit": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        "an integer >= 1, or empty for no limit (pause the queue to stop it)",
    ),
    "lease_timeout": (lambda v: _is_number(v) and v > 0, "a finite number of seconds > 0"),
    "max_attempts": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "retention": (lambda v: isinstance(v, timedelta) and v >= timedelta(0), "a duration >= 0"),
}


def queue_option_errors(**options: object) -> dict[str, str]:
    """{option: what is wrong} for the options a queue cannot run with (a zero lease, no attempts, a negative
    retention...); empty when all are fine. The admin's queue form shows these per field."""
    errors = {}
    for name, value in options.items():
        rule = QUEUE_OPTION_RULES.get(name)
        if rule is None:
            errors[name] = f"unknown queue option; allowed: {', '.join(sorted(QUEUE_OPTION_RULES))}"
        elif not rule[0](value):
            errors[name] = f"must be {rule[1]}, not {value!r}"
    return errors


def set_queue_options(name: str, **options: object) -> int:
    """Change a queue's settings (concurrency_limit, lease_timeout, max_attempts, retention); ValueError naming
    every bad option (nothing changed) if any is unknown or out of range."""
    errors = queue_option_errors(**options)
    if errors:
        unknown = sorted(n for n in errors if n not in QUEUE_OPTION_RULES)
        if unknown:
            allowed = ", ".join(sorted(QUEUE_OPTION_RULES))
            raise ValueError(f"unknown queue options: {', '.join(unknown)}; allowed: {allowed}")
        raise ValueError("; ".join(f"{n} {message}" for n, message in errors.items()))
    return Queue.objects.filter(name=name).update(**options)


__all__ = [
    "cancel_items",
    "pause_queue",
    "purge_dead_letters",
    "queue_option_errors",
    "requeue_dead_letters",
    "requeue_items",
    "resume_queue",
    "retry_now",
    "set_queue_options",
]
