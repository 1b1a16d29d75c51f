"""Cron schedules -> queue items. Each (schedule, fire time) fires once, whatever the number of schedulers.

The guarantee is the unique constraint on ScheduleFire(schedule, fire_at): the fire row and the enqueue of its
target are written in one transaction, so a fire time is either fired (row + item) or not at all, and a second
scheduler racing for the same fire time inserts nothing and enqueues nothing. Schedulers also claim due
schedules with SKIP LOCKED, which keeps them from doing the same work twice, but correctness rests on the row.
Cron strings are parsed by croniter (five fields), in the schedule's time zone; fire times are stored in UTC.

The worker's "scheduler" maintenance unit calls `tick()` about once a second; the admin calls `run_now()`,
`set_enabled()` and `reschedule()`.
"""

import logging
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone

from . import events, hooks
from .engine.alias import atomic, queue_connection

logger = logging.getLogger("jobsite.scheduler")

# With catch-up "skip", a fire time missed by more than this is skipped rather than fired late.
MISFIRE_GRACE = timedelta(seconds=60)
# With catch-up "all", at most this many missed fire times are fired (the latest ones); older ones are skipped.
MAX_CATCH_UP = 100
ERROR_CHARS = 1000

INSERT_FIRE = """
INSERT INTO queue_app_schedulefire (schedule_id, fire_at, manual, created_at)
VALUES (%(schedule)s, %(fire_at)s, %(manual)s, now())
ON CONFLICT (schedule_id, fire_at) DO NOTHING
RETURNING id
"""


@dataclass(frozen=True, slots=True)
class Fired:
    """One fire time that this call fired. `duplicate`: the dedup window was still held by an earlier fire's
    item, so nothing new was queued (`item_id` is that earlier item)."""

    schedule: str
    fire_at: datetime
    item_id: int | None
    duplicate: bool = False


def _cron_iter(expression: str, start: datetime | None = None) -> Any:
    """croniter's iterator (imported on first use: a project's start, and its admin's, do not load it)."""
    from croniter import croniter as iterator

    return iterator(expression, start)


def validate_cron(expression: str) -> str:
    """The expression, whitespace normalised, if croniter accepts it as five cron fields; else ValidationError."""
    expression = " ".join((expression or "").split())
    message = (
        f"{expression!r} is not a valid cron expression; use five fields: minute hour day-of-month month "
        "day-of-week, e.g. '*/5 * * * *' (every five minutes) or '0 3 * * 1' (Mondays at 03:00)"
    )
    if len(expression.split()) != 5 or not _is_valid(expression):
        raise ValidationError(message, code="invalid_cron")
    try:
        _cron_iter(expression, datetime.now(UTC)).get_next(datetime)
    except Exception:  # e.g. "0 0 31 2 *" parses but never matches
        raise ValidationError(message + " that matches at least one date", code="invalid_cron") from None
    return expression


def _is_valid(expression: str) -> bool:
    from croniter import croniter as iterator

    return iterator.is_valid(expression)


def validate_timezone(name: str) -> str:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValidationError(
            f"{name!r} is not a known time zone (an IANA name such as 'UTC' or 'Europe/Paris')", code="invalid_tz"
        ) from None
    return name


def describe(expression: str) -> str:
    """The cron expression in words ("At 03:00, only on Monday")."""
    from cron_descriptor import get_description

    try:
        return get_description(expression)
    except Exception:  # the describer is a nicety; never let it break a page
        return expression


def fire_times(expression: str, tz: str, after: datetime, n: int = 5) -> list[datetime]:
    """The next `n` fire times strictly after `after`, as aware UTC datetimes."""
    it = _cron_iter(expression, after.astimezone(zoneinfo.ZoneInfo(tz)))
    return [it.get_next(datetime).astimezone(UTC) for _ in range(n)]


def next_fire(expression: str, tz: str, after: datetime) -> datetime:
    return fire_times(expression, tz, after, 1)[0]


def latest_fire_at_or_before(expression: str, tz: str, now: datetime) -> datetime:
    it = _cron_iter(expression, (now + timedelta(microseconds=1)).astimezone(zoneinfo.ZoneInfo(tz)))
    return it.get_prev(datetime).astimezone(UTC)


class UnknownTargetKind(LookupError):
    """A schedule's target kind no installed app runs (a Spark or workflow schedule without its app)."""


APP_OF_KIND = {"spark": "queue_app.spark", "workflow": "queue_app.workflows"}


def target_of(kind: str) -> hooks.ScheduleTarget:
    """The layer's ScheduleTarget for `kind`; UnknownTargetKind naming the app to add when none is installed."""
    found = hooks.schedule_targets.get(kind)
    if found is None:
        app = APP_OF_KIND.get(kind)
        raise UnknownTargetKind(
            f"no installed app runs {kind!r} schedule targets" + (f": add {app!r} to INSTALLED_APPS" if app else "")
        )
    return found


def enqueue_target(schedule: Any, fire_at: datetime) -> tuple[int | None, bool]:
    """Queue the schedule's target: a registered task with its payload, or a target of a layer's kind (a Spark
    run with its params, a workflow with its params: hooks.schedule_targets; a workflow has no item id). Returns
    (item id, whether the dedup window returned an earlier item instead)."""
    if schedule.target_kind != "task":
        return target_of(schedule.target_kind).fire(schedule), False
    from .registry import get_task

    dedup = {}
    if schedule.dedup_window:
        dedup = {"dedup_key": f"schedule:{schedule.name}", "dedup_window": schedule.dedup_window}
    item = get_task(schedule.target).enqueue(schedule.payload, **dedup)
    return item.id, item.duplicate


def fire(schedule: Any, fire_at: datetime, *, manual: bool = False) -> Fired | None:
    """Enqueue the schedule's target for `fire_at` unless that fire time was fired already (None then).
    Runs in the caller's transaction: the fire row and the item commit together or not at all."""
    from .models import ScheduleFire

    with queue_connection().cursor() as cur:
        cur.execute(INSERT_FIRE, {"schedule": schedule.pk, "fire_at": fire_at, "manual": manual})
        row = cur.fetchone()
    if row is None:
        return None
    item_id, duplicate = enqueue_target(schedule, fire_at)
    if duplicate:
        logger.info("schedule %s: %s not queued, item %s still holds the dedup window", schedule.name, fire_at, item_id)
    else:
        ScheduleFire.objects.filter(id=row[0]).update(item_id=item_id)
    return Fired(schedule.name, fire_at, item_id, duplicate)


def _skipped(schedule: Any, fire_at: datetime, now: datetime) -> None:
    """A fire time the "skip" policy lets pass: logged, and published as schedule.fire_missed (in the claiming
    transaction, so a rolled-back tick publishes nothing)."""
    late = now - fire_at
    logger.info("schedule %s: skipping fire time %s (%.0fs late)", schedule.name, fire_at, late.total_seconds())
    events.publish(
        "schedule.fire_missed",
        {
            "schedule": schedule.name,
            "fire_at": fire_at.isoformat(),
            "late_seconds": round(late.total_seconds(), 3),
            "target": schedule.target,
        },
    )


def missed_fire_times(schedule: Any, now: datetime) -> list[datetime]:
    """The fire times from the schedule's next_fire_at up to `now` that catch-up fires: none ("skip", beyond
    the grace), the latest ("once"), or every one of them, at most the latest MAX_CATCH_UP ("all")."""
    if schedule.next_fire_at is None:
        return []
    latest = latest_fire_at_or_before(schedule.cron, schedule.timezone, now)
    if latest < schedule.next_fire_at:
        return []  # next_fire_at was moved past this fire time (rescheduled): nothing is due yet
    if schedule.catch_up == "skip" and now - latest > MISFIRE_GRACE:
        _skipped(schedule, latest, now)
        return []
    if schedule.catch_up != "all":
        return [latest]
    times: list[datetime] = []
    it = _cron_iter(
        schedule.cron,
        (schedule.next_fire_at - timedelta(microseconds=1)).astimezone(zoneinfo.ZoneInfo(schedule.timezone)),
    )
    while (t := it.get_next(datetime).astimezone(UTC)) <= latest:
        times.append(t)
        if len(times) > MAX_CATCH_UP:
            times.pop(0)
    return times


def _fire_due(schedule: Any, now: datetime) -> list[Fired]:
    """Fire what is due of one claimed schedule and move its next_fire_at past `now`."""
    fired = []
    for fire_at in missed_fire_times(schedule, now):
        try:
            with atomic():
                one = fire(schedule, fire_at)
        except Exception as exc:  # a broken target must not stop the other schedules
            logger.error("schedule %s: could not fire %s: %s", schedule.name, fire_at, exc)
            schedule.last_error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
            break
        if one is not None:
            fired.append(one)
            schedule.last_fire_at = fire_at
            schedule.last_error = ""
    schedule.next_fire_at = next_fire(schedule.cron, schedule.timezone, now)
    return fired


def tick(now: datetime | None = None, *, limit: int = 100) -> list[Fired]:
    """Fire every enabled schedule whose next fire time has come. Safe in any number of workers at once:
    schedules are claimed with SKIP LOCKED, and the unique fire row settles any race that remains.

    A schedule created without next_fire_at gets one (no fire). A schedule whose cron or time zone no longer
    parses records the error and waits (next_fire_at empty) until it is saved again."""
    from .models import Schedule

    now = now or timezone.now()
    fired: list[Fired] = []
    with atomic():
        due = list(
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(Q(next_fire_at__lte=now) | Q(next_fire_at__isnull=True, last_error=""), enabled=True)
            .order_by("next_fire_at")[:limit]
        )
        for schedule in due:
            try:
                fired += _fire_due(schedule, now)
            except Exception as exc:  # bad cron or time zone stored behind the admin's back
                logger.error("schedule %s: cannot compute its fire times: %s", schedule.name, exc)
                schedule.last_error = f"cannot compute fire times: {type(exc).__name__}: {exc}"[:ERROR_CHARS]
                schedule.next_fire_at = None
            schedule.save(update_fields=["last_fire_at", "next_fire_at", "last_error"])
    return fired


def run_now(schedule: Any) -> Fired | None:
    """Fire the schedule's target at once ("run now" in the admin), recorded as a manual fire."""
    with atomic():
        return fire(schedule, timezone.now(), manual=True)


def reschedule(schedule: Any, now: datetime | None = None) -> None:
    """Set next_fire_at from the cron, time zone and enable flag (not saved): after an edit, or on enabling,
    so time spent disabled or the old expression never counts as missed fire times."""
    schedule.next_fire_at = (
        next_fire(schedule.cron, schedule.timezone, now or timezone.now()) if schedule.enabled else None
    )


def set_enabled(pks: Iterable[int], enabled: bool) -> int:
    """Enable or disable schedules; returns how many changed. Enabling computes the next fire time from now."""
    from .models import Schedule

    changed = 0
    with atomic():
        for schedule in Schedule.objects.select_for_update().filter(pk__in=list(pks)).exclude(enabled=enabled):
            schedule.enabled = enabled
            reschedule(schedule)
            schedule.last_error = ""
            schedule.save(update_fields=["enabled", "next_fire_at", "last_error"])
            changed += 1
    return changed
