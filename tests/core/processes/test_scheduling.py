"""Cron schedules: each (schedule, fire time) fires once however many schedulers tick, catch-up after downtime,
time zones, broken targets, the admin's form and screens, and the scheduler inside a real `run_worker`.

Scheduler tests pass a simulated `now` to scheduling.tick(); the items they queue are real."""

import random
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from queue_app import scheduling
from queue_app.admin.schedules import ScheduleForm
from queue_app.models import CatchUp, ItemState, QueueItem, Schedule, ScheduleFire
from tests.support.schedule_forms import FORM_FIELDS, post_data

MONDAY = datetime(2031, 1, 6, tzinfo=UTC)  # a Monday, 00:00 UTC
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def schedule(name: str = "every-minute", cron: str = "* * * * *", **fields) -> Schedule:
    fields.setdefault("target", "queue_app.noop")
    fields.setdefault("next_fire_at", scheduling.next_fire(cron, fields.get("timezone", "UTC"), MONDAY - MINUTE))
    return Schedule.objects.create(name=name, cron=cron, **fields)


def items(task: str = "queue_app.noop"):
    return QueueItem.objects.filter(task=task)


# -- exactly once -----------------------------------------------------------------------------------------------


def _scheduler(seed: int, steps: int, barrier: threading.Barrier, failures: list[BaseException]) -> None:
    """Tick every 7 simulated seconds, 0-3 s of jitter, in lockstep with the other scheduler."""
    rng = random.Random(seed)
    try:
        for step in range(steps):
            barrier.wait(timeout=60)
            scheduling.tick(now=MONDAY + timedelta(seconds=7 * step + rng.uniform(0, 3)))
    except BaseException as exc:  # reported by the test
        failures.append(exc)
        barrier.abort()
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_fire_each_fire_time_of_an_hour_exactly_once():
    minutely = schedule()
    five = schedule("every-five", "*/5 * * * *")
    steps = 3600 // 7 + 1  # the last tick is at 3598 s (+ jitter < 3 s): still inside the hour
    barrier, failures = threading.Barrier(2), []
    threads = [threading.Thread(target=_scheduler, args=(seed, steps, barrier, failures)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    minute_fires = sorted(ScheduleFire.objects.filter(schedule=minutely).values_list("fire_at", flat=True))
    assert minute_fires == [MONDAY + m * MINUTE for m in range(60)]
    assert ScheduleFire.objects.filter(schedule=five).count() == 12
    fired_items = list(ScheduleFire.objects.values_list("item_id", flat=True))
    assert None not in fired_items and len(set(fired_items)) == 72
    assert items().count() == 72
    minutely.refresh_from_db()
    assert minutely.last_fire_at == MONDAY + 59 * MINUTE
    assert minutely.next_fire_at == MONDAY + HOUR


def _fire_in_transaction(sched: Schedule, hold: float, barrier: threading.Barrier, results: list) -> None:
    try:
        barrier.wait(timeout=30)
        with transaction.atomic():
            results.append(scheduling.fire(sched, MONDAY))
            time.sleep(hold)  # the other scheduler's INSERT waits on this uncommitted fire row
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_racing_fires_of_one_fire_time_queue_one_item():
    """The guarantee is the unique (schedule, fire time) row, not SKIP LOCKED: two transactions that both try
    to fire the same time, without claiming the schedule, queue one item between them."""
    sched = schedule()
    barrier, results = threading.Barrier(2), []
    threads = [
        threading.Thread(target=_fire_in_transaction, args=(sched, hold, barrier, results)) for hold in (0.3, 0.0)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results, key=lambda r: r is not None) == [None, results[0] or results[1]]
    assert ScheduleFire.objects.count() == 1
    assert items().count() == 1


def test_a_fire_time_that_already_fired_never_fires_again(db):
    sched = schedule()
    first = scheduling.fire(sched, MONDAY)
    assert first is not None and first.item_id is not None
    assert scheduling.fire(sched, MONDAY) is None
    assert items().count() == 1


# -- catch-up, dedup, disabled, errors --------------------------------------------------------------------------


def test_catch_up_skip_fires_nothing_for_fire_times_missed_in_downtime(db):
    hourly = schedule("hourly", "0 * * * *", catch_up=CatchUp.SKIP)
    back = MONDAY + 3 * HOUR + 30 * MINUTE  # down from before 00:00 until 03:30
    assert scheduling.tick(now=back) == []
    hourly.refresh_from_db()
    assert hourly.next_fire_at == MONDAY + 4 * HOUR
    assert hourly.last_fire_at is None
    assert not ScheduleFire.objects.exists() and not items().exists()


def test_catch_up_skip_still_fires_a_fire_time_within_the_grace(db):
    hourly = schedule("hourly", "0 * * * *", catch_up=CatchUp.SKIP)
    (fired,) = scheduling.tick(now=MONDAY + 3 * HOUR + scheduling.MISFIRE_GRACE / 2)
    assert fired.fire_at == MONDAY + 3 * HOUR
    hourly.refresh_from_db()
    assert hourly.next_fire_at == MONDAY + 4 * HOUR


def test_catch_up_once_fires_once_for_the_latest_missed_fire_time(db):
    hourly = schedule("hourly", "0 * * * *", catch_up=CatchUp.ONCE)
    back = MONDAY + 3 * HOUR + 30 * MINUTE
    (fired,) = scheduling.tick(now=back)
    assert fired.fire_at == MONDAY + 3 * HOUR
    assert scheduling.tick(now=back + MINUTE) == []
    hourly.refresh_from_db()
    assert hourly.last_fire_at == MONDAY + 3 * HOUR
    assert hourly.next_fire_at == MONDAY + 4 * HOUR
    assert items().count() == 1


def test_dedup_window_skips_a_fire_while_an_earlier_fires_item_holds_the_key(db):
    schedule(dedup_window=3600)
    (first,) = scheduling.tick(now=MONDAY + timedelta(seconds=1))
    (second,) = scheduling.tick(now=MONDAY + MINUTE + timedelta(seconds=1))
    assert not first.duplicate and second.duplicate
    assert second.item_id == first.item_id
    assert items().count() == 1
    assert ScheduleFire.objects.get(fire_at=MONDAY + MINUTE).item_id is None


def test_disabled_schedule_does_not_fire(db):
    schedule(enabled=False)
    assert scheduling.tick(now=MONDAY + 10 * MINUTE) == []
    assert not ScheduleFire.objects.exists()


def test_enabling_a_schedule_counts_no_time_spent_disabled_as_missed(db):
    sched = schedule(enabled=False, catch_up=CatchUp.ONCE)
    scheduling.set_enabled([sched.pk], True)
    sched.refresh_from_db()
    assert sched.enabled and sched.next_fire_at > timezone.now()
    assert scheduling.set_enabled([sched.pk], True) == 0  # already enabled: nothing changed


def test_broken_target_records_its_error_and_other_schedules_still_fire(db):
    broken = schedule("broken", target="no.such.task")
    bad_spark = schedule("bad-spark", target_kind="spark", target="no_such_spark_job")
    healthy = schedule("healthy")
    fired = scheduling.tick(now=MONDAY + timedelta(seconds=5))
    assert [f.schedule for f in fired] == ["healthy"]
    broken.refresh_from_db()
    bad_spark.refresh_from_db()
    assert "unknown task: no.such.task" in broken.last_error
    assert "no_such_spark_job" in bad_spark.last_error
    assert broken.next_fire_at == MONDAY + MINUTE  # it tries again at its next fire time
    assert not ScheduleFire.objects.filter(schedule__in=[broken, bad_spark]).exists()  # rolled back with it
    assert ScheduleFire.objects.filter(schedule=healthy).count() == 1


def test_a_cron_string_that_no_longer_parses_parks_the_schedule_with_its_error(db):
    bad = schedule("bad-cron")
    Schedule.objects.filter(pk=bad.pk).update(cron="every full moon")  # behind the admin form's back
    scheduling.tick(now=MONDAY + timedelta(seconds=5))
    bad.refresh_from_db()
    assert bad.next_fire_at is None and "cannot compute fire times" in bad.last_error
    assert scheduling.tick(now=MONDAY + 2 * MINUTE) == []  # parked until someone fixes and saves it


def test_schedule_without_next_fire_time_gets_one_and_fires_from_then(db):
    sched = schedule(next_fire_at=None)
    assert scheduling.tick(now=MONDAY + timedelta(seconds=30)) == []
    sched.refresh_from_db()
    assert sched.next_fire_at == MONDAY + MINUTE


def test_run_now_fires_at_once_as_a_manual_fire(db):
    sched = schedule(enabled=False)
    fired = scheduling.run_now(sched)
    fire = ScheduleFire.objects.get(schedule=sched)
    assert fire.manual and fire.item_id == fired.item_id
    assert QueueItem.objects.get(id=fired.item_id).state == ItemState.READY


def test_schedule_payload_is_the_items_payload(db):
    schedule(target="queue_app.echo", payload={"hello": "world"})
    (fired,) = scheduling.tick(now=MONDAY + timedelta(seconds=1))
    assert QueueItem.objects.get(id=fired.item_id).payload == {"hello": "world"}


# -- time zones -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("day", "utc_hour"),
    [(datetime(2031, 1, 15, tzinfo=UTC), 8), (datetime(2031, 7, 15, tzinfo=UTC), 7)],
    ids=["winter-CET", "summer-CEST"],
)
def test_daily_0900_paris_fires_at_0800_or_0700_utc_with_dst(db, day, utc_hour):
    expected = day.replace(hour=utc_hour)
    assert scheduling.next_fire("0 9 * * *", "Europe/Paris", day) == expected
    sched = schedule("paris", "0 9 * * *", timezone="Europe/Paris", next_fire_at=expected)
    assert scheduling.tick(now=expected - timedelta(seconds=1)) == []
    (fired,) = scheduling.tick(now=expected + timedelta(seconds=2))
    assert fired.fire_at == expected
    sched.refresh_from_db()
    assert sched.next_fire_at == expected + timedelta(days=1)


def test_fire_times_cross_the_spring_dst_change_in_local_time():
    times = scheduling.fire_times("0 9 * * *", "Europe/Paris", datetime(2031, 3, 29, 12, tzinfo=UTC), 3)
    assert times == [
        datetime(2031, 3, 30, 7, tzinfo=UTC),  # Sunday 30 March: clocks went forward at 02:00
        datetime(2031, 3, 31, 7, tzinfo=UTC),
        datetime(2031, 4, 1, 7, tzinfo=UTC),
    ]


# -- validation and the admin -----------------------------------------------------------------------------------


def form(**overrides) -> ScheduleForm:
    data = {**FORM_FIELDS, **overrides}
    return ScheduleForm(data=data)


def test_admin_form_accepts_a_good_schedule(db):
    f = form(cron="  */5   * * * * ")
    assert f.is_valid(), f.errors
    assert f.cleaned_data["cron"] == "*/5 * * * *"


@pytest.mark.parametrize("cron", ["every day", "61 * * * *", "* * * *", "* * * * * *", "0 0 31 2 *"])
def test_admin_form_rejects_a_bad_cron_string_with_a_clear_message(db, cron):
    f = form(cron=cron)
    assert not f.is_valid()
    assert "not a valid cron expression" in f.errors["cron"][0]


def test_admin_form_requires_a_cron_string(db):
    f = form(cron="")
    assert not f.is_valid()
    assert f.errors["cron"] == ["This field is required."]


def test_admin_form_rejects_an_unknown_time_zone(db):
    f = form(timezone="Mars/Olympus_Mons")
    assert not f.is_valid()
    assert "'Mars/Olympus_Mons' is not a known time zone" in f.errors["timezone"][0]


def test_admin_form_rejects_an_unknown_task_naming_the_registered_ones(db):
    f = form(target="billing.nonexistent")
    assert not f.is_valid()
    message = f.errors["target"][0]
    assert "No task named 'billing.nonexistent' is registered" in message
    assert "queue_app.noop" in message


def test_admin_form_accepts_a_django_task_and_checks_its_payload_shape(db):
    assert form(target="tests.tasks.django_tasks_app.add", payload='{"args": [1, 2]}').is_valid()
    bad = form(target="tests.tasks.django_tasks_app.add", payload='{"a": 1}')
    assert not bad.is_valid()
    assert '{"args": [...], "kwargs": {...}}' in bad.errors["payload"][0]


def test_admin_form_rejects_an_unknown_spark_job(db):
    f = form(target_kind="spark", target="no_such_job")
    assert not f.is_valid()
    assert "No Spark job named 'no_such_job'" in f.errors["target"][0]
    assert "queue_analytics" in f.errors["target"][0]


def test_admin_form_reports_every_bad_spark_param(db):
    f = form(target_kind="spark", target="queue_analytics", payload='{"partitions": 0, "colour": "red"}')
    assert not f.is_valid()
    errors = " ".join(f.errors["payload"])
    assert "partitions: must be >= 1" in errors
    assert "colour: unknown parameter" in errors
    assert form(target_kind="spark", target="queue_analytics", payload='{"partitions": 8}').is_valid()


def changelist() -> str:
    return reverse("admin:queue_app_schedule_changelist")


def change(pk: int) -> str:
    return reverse("admin:queue_app_schedule_change", args=[pk])


def test_admin_list_shows_cron_in_words_target_and_fire_times(admin_client):
    schedule("prune", "*/10 * * * *", target="queue_app.prune", last_error="KeyError: boom")
    page = admin_client.get(changelist()).content.decode()
    assert "Every 10 minutes" in page
    assert "Registered task: queue_app.prune" in page
    assert "KeyError: boom" in page


def test_admin_detail_shows_the_next_five_fire_times_and_recent_fires(admin_client):
    sched = schedule("paris", "0 9 * * 1-5", timezone="Europe/Paris")
    scheduling.fire(sched, MONDAY + 8 * HOUR)
    page = admin_client.get(change(sched.pk)).content.decode()
    assert "Monday through Friday" in page and scheduling.describe(sched.cron) in page
    upcoming = scheduling.fire_times(sched.cron, sched.timezone, timezone.now(), 5)
    for moment in upcoming:
        assert moment.astimezone(scheduling.zoneinfo.ZoneInfo("Europe/Paris")).strftime("%Y-%m-%d %H:%M") in page
    assert page.count("<li>") >= 5
    assert "Last 20 fires" in page and "2031-01-06 08:00" in page


def test_admin_add_computes_the_next_fire_time(admin_client):
    assert (
        "Shown once the schedule is saved" in admin_client.get(reverse("admin:queue_app_schedule_add")).content.decode()
    )
    response = admin_client.post(reverse("admin:queue_app_schedule_add"), post_data())
    assert response.status_code == 302, response.content.decode()[:2000]
    sched = Schedule.objects.get(name="nightly")
    assert sched.next_fire_at == scheduling.next_fire("0 3 * * *", "UTC", timezone.now())


def test_admin_edit_of_the_cron_recomputes_the_next_fire_time_and_clears_the_error(admin_client):
    sched = schedule("nightly", "0 3 * * *", last_error="old problem")
    response = admin_client.post(change(sched.pk), post_data(cron="30 4 * * *"))
    assert response.status_code == 302
    sched.refresh_from_db()
    assert sched.next_fire_at == scheduling.next_fire("30 4 * * *", "UTC", timezone.now())
    assert sched.last_error == ""


def test_admin_change_form_shows_a_bad_cron_error(admin_client):
    sched = schedule("nightly", "0 3 * * *")
    response = admin_client.post(change(sched.pk), post_data(cron="0 25 * * *"))
    assert response.status_code == 200
    assert "is not a valid cron expression" in response.content.decode()
    sched.refresh_from_db()
    assert sched.cron == "0 3 * * *"


def test_admin_run_now_action_fires_and_writes_a_log_entry(admin_client):
    sched = schedule(enabled=False)
    response = admin_client.post(changelist(), {"action": "run_now", "_selected_action": [sched.pk]}, follow=True)
    assert "Fired 1 schedule now." in response.content.decode()
    fire = ScheduleFire.objects.get(schedule=sched)
    assert fire.manual and QueueItem.objects.filter(id=fire.item_id).exists()
    assert LogEntry.objects.filter(object_id=str(sched.pk), change_message__contains="run_now").exists()


def test_admin_enable_and_disable_actions(admin_client):
    on, off = schedule("on"), schedule("off", enabled=False)
    response = admin_client.post(changelist(), {"action": "disable", "_selected_action": [on.pk, off.pk]}, follow=True)
    assert "Disabled 1 of 2 selected" in response.content.decode()
    admin_client.post(changelist(), {"action": "enable", "_selected_action": [on.pk, off.pk]})
    assert set(Schedule.objects.values_list("enabled", flat=True)) == {True}
    assert Schedule.objects.filter(next_fire_at__gt=timezone.now()).count() == 2


def test_admin_run_now_needs_the_change_permission(client, db):
    sched = schedule()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client.force_login(viewer)
    assert client.get(change(sched.pk)).status_code == 200
    response = client.post(changelist(), {"action": "run_now", "_selected_action": [sched.pk]})
    assert response.status_code == 403
    assert not ScheduleFire.objects.exists()


# -- the scheduler in run_worker --------------------------------------------------------------------------------


def due_now() -> Schedule:
    """A minutely schedule whose current minute is due (catch-up once: however long the worker takes to start)."""
    now = timezone.now()
    return schedule(
        "due-now",
        catch_up=CatchUp.ONCE,
        next_fire_at=scheduling.latest_fire_at_or_before("* * * * *", "UTC", now),
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_worker_scheduler_fires_a_due_schedule_and_runs_its_item(manage):
    sched = due_now()
    result = manage("run_worker", "--burst", "--concurrency", "1", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    fire = ScheduleFire.objects.get(schedule=sched)
    assert QueueItem.objects.get(id=fire.item_id).state == ItemState.DONE
    sched.refresh_from_db()
    assert sched.next_fire_at > fire.fire_at


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_worker_no_scheduler_fires_nothing(manage):
    sched = due_now()
    result = manage("run_worker", "--burst", "--concurrency", "1", "--no-scheduler", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not ScheduleFire.objects.filter(schedule=sched).exists()
    assert not QueueItem.objects.exists()


def test_catch_up_all_fires_every_missed_fire_time_in_order(db):
    hourly = schedule("hourly", "0 * * * *", catch_up=CatchUp.ALL)
    back = MONDAY + 3 * HOUR + 30 * MINUTE  # down from before 00:00 until 03:30: 00:00..03:00 missed
    fired = scheduling.tick(now=back)
    assert [f.fire_at for f in fired] == [MONDAY + h * HOUR for h in range(4)]
    assert scheduling.tick(now=back + MINUTE) == []  # each fire time once
    hourly.refresh_from_db()
    assert hourly.last_fire_at == MONDAY + 3 * HOUR and hourly.next_fire_at == MONDAY + 4 * HOUR
    assert items().count() == 4


def test_catch_up_all_is_bounded_to_the_latest_fire_times(db):
    schedule("minutely", "* * * * *", catch_up=CatchUp.ALL)
    back = MONDAY + 10 * HOUR  # 601 minutely fire times missed
    fired = scheduling.tick(now=back)
    assert len(fired) == scheduling.MAX_CATCH_UP
    assert fired[-1].fire_at == back and fired[0].fire_at == back - (scheduling.MAX_CATCH_UP - 1) * MINUTE
    assert items().count() == scheduling.MAX_CATCH_UP


def test_a_schedule_can_start_a_workflow(db):
    from queue_app.models import TargetKind
    from queue_app.workflows.models import Workflow
    from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_diamond)

    schedule("wf", "0 * * * *", target_kind=TargetKind.WORKFLOW, target="wf_diamond", catch_up=CatchUp.ONCE)
    (fired,) = scheduling.tick(now=MONDAY + 30 * MINUTE)
    assert fired.item_id is None
    (w,) = Workflow.objects.all()
    assert w.name == "wf_diamond" and w.started_by == "schedule wf"
