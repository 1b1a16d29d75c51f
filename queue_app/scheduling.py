"""Cron schedules -> queue items. Each (schedule, fire time) fires once, whatever the number of schedulers.

The guarantee is the unique constraint on ScheduleFire(schedule, fire_at): the fire row and the enqueue of its
target are written in one transaction, so a fire time is either fired (row + item) or not at all, and a second
scheduler racing for the same fire time inserts nothing and enqueues nothing. Cron strings are parsed by
croniter, in the schedule's time zone.
"""

import logging
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import croniter
from django.core.exceptions import ValidationError
from django.db import connections, transaction
from django.utils import timezone

logger = logging.getLogger("jobsite.scheduler")

# With catch-up "skip", a fire time missed by more than this is skipped rather than fired late.
MISFIRE_GRACE = timedelta(seconds=60)

INSERT_FIRE = """
INSERT INTO queue_app_schedulefire (schedule_id, fire_at, manual, created_at)
VALUES (%(schedule)s, %(fire_at)s, %(manual)s, now())
ON CONFLICT (schedule_id, fire_at) DO NOTHING
RETURNING id
"""


@dataclass(frozen=True, slots=True)
class Fired:
    schedule: str
    fire_at: datetime
    item_id: int | None


def validate_cron(expression: str) -> str:
    expression = " ".join((expression or "").split())
    if not expression or not croniter.is_valid(expression):
        raise ValidationError(
            f"{expression!r} is not a valid cron expression; use five fields: minute hour day-of-month month "
            "day-of-week, e.g. '*/5 * * * *' (every five minutes) or '0 3 * * 1' (Mondays at 03:00)",
            code="invalid_cron",
        )
    return expression


def validate_timezone(name: str) -> str:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError(f"{name!r} is not a known time zone (e.g. 'UTC', 'Europe/Paris')", code="tz") from None
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
    it = croniter(expression, after.astimezone(zoneinfo.ZoneInfo(tz)))
    return [it.get_next(datetime).astimezone(UTC) for _ in range(n)]


def next_fire(expression: str, tz: str, after: datetime) -> datetime:
    return fire_times(expression, tz, after, 1)[0]


def latest_fire_at_or_before(expression: str, tz: str, now: datetime) -> datetime:
    it = croniter(expression, (now + timedelta(microseconds=1)).astimezone(zoneinfo.ZoneInfo(tz)))
    return it.get_prev(datetime).astimezone(UTC)


def fire(schedule, fire_at: datetime, *, manual: bool = False) -> int | None:
    """Enqueue the schedule's target for `fire_at` unless that fire time was fired already.
    Returns the item id, or None when another scheduler fired it first. Runs in the caller's transaction."""
    from .models import ScheduleFire

    with connections["default"].cursor() as cur:
        cur.execute(INSERT_FIRE, {"schedule": schedule.pk, "fire_at": fire_at, "manual": manual})
        row = cur.fetchone()
    if row is None:
        return None
    item_id = enqueue_target(schedule, fire_at)
    ScheduleFire.objects.filter(id=row[0]).update(item_id=item_id)
    return item_id


def enqueue_target(schedule, fire_at: datetime) -> int:
    """Queue the schedule's target: a registered task with its payload, or a Spark run with its params."""
    dedup = {}
    if schedule.dedup_window:
        dedup = {"dedup_key": f"schedule:{schedule.name}", "dedup_window": schedule.dedup_window}
    if schedule.target_kind == "spark":
        from .spark.runs import trigger_run

        run = trigger_run(
            schedule.target, schedule.payload, trigger="schedule", requested_by=f"schedule {schedule.name}"
        )
        return run.item_id
    from .registry import get_task

    task = get_task(schedule.target)
    return task.enqueue(schedule.payload, **dedup).id


def tick(now: datetime | None = None, *, limit: int = 100) -> list[Fired]:
    """Fire every enabled schedule whose next fire time has come. Safe in any number of workers at once:
    schedules are claimed with SKIP LOCKED, and the unique fire row settles any race that remains."""
    from .models import Schedule

    now = now or timezone.now()
    fired: list[Fired] = []
    with transaction.atomic():
        due = list(
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(enabled=True, next_fire_at__lte=now)
            .order_by("next_fire_at")[:limit]
        )
        for schedule in due:
            fire_at = latest_fire_at_or_before(schedule.cron, schedule.timezone, now)
            late = now - fire_at
            if schedule.catch_up == "skip" and late > MISFIRE_GRACE:
                logger.info(
                    "schedule %s: skipping fire time %s (%.0fs late)", schedule.name, fire_at, late.total_seconds()
                )
            else:
                try:
                    with transaction.atomic():
                        item_id = fire(schedule, fire_at)
                except Exception as exc:  # a broken target must not stop the other schedules
                    logger.error("schedule %s: could not fire %s: %s", schedule.name, fire_at, exc)
                    schedule.last_error = str(exc)[:1000]
                else:
                    if item_id is not None:
                        fired.append(Fired(schedule.name, fire_at, item_id))
                        schedule.last_fire_at = fire_at
                        schedule.last_error = ""
            schedule.next_fire_at = next_fire(schedule.cron, schedule.timezone, now)
            schedule.save(update_fields=["last_fire_at", "next_fire_at", "last_error"])
    return fired


def run_now(schedule) -> int | None:
    """Fire the schedule's target at once ("run now" in the admin), recorded as a manual fire."""
    with transaction.atomic():
        return fire(schedule, timezone.now(), manual=True)
