"""Per-job run policies: declared with the job, overridden by settings, applied to the run's queue item (priority,
attempts, concurrency lane, timeout), to its retries (which ends retry) and to its history (retention).
The concurrency limit across real workers is proven in test_spark_policy_workers.py."""

import datetime as dt
import os

import pytest
from django.test import override_settings
from django.utils import timezone

from queue_app.models import QueueItem, SparkRun, SparkScript
from queue_app.registry import Context, Delivery
from queue_app.spark import eventlog
from queue_app.spark.launcher import LaunchResult
from queue_app.spark.policy import PolicyError, SparkPolicy, policy_for
from queue_app.spark.registry import SparkParamError, get_job
from queue_app.spark.runs import prune_runs, retried, trigger_run, waiting_for
from queue_app.spark.scripts import ROOTS_ENV, save_script

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_concurrent": 0}, "max_concurrent must be a whole number from 1"),
        ({"attempts": "3"}, "attempts must be a whole number"),
        ({"retry_on": ["crashed"]}, "retry_on must list some of failed, timed_out"),
        ({"timeout": -5}, "timeout must be a number of seconds > 0"),
        ({"resource_profile": "huge"}, "resource_profile 'huge' is not one of large, medium, small"),
        ({"keep_days": 0}, "keep_days must be a whole number from 1"),
        ({"retries": 3}, "unknown policy keys: retries"),
    ],
)
def test_bad_policies_are_refused_with_the_field_named(raw, message):
    with pytest.raises(PolicyError, match=message):
        SparkPolicy.from_mapping(raw)


def test_settings_override_the_declared_policy_per_job():
    with override_settings(
        JOBSITE={"SPARK_JOB_POLICIES": {"demo_sleep": {"priority": 7, "resource_profile": "small"}}}
    ):
        policy = policy_for(get_job("demo_sleep"))
        assert policy.priority == 7 and policy.conf()["spark.driver.memory"] == "1g"
    assert policy_for(get_job("demo_sleep")) == SparkPolicy()


def test_a_runs_item_carries_its_jobs_priority_attempts_lane_and_timeout():
    policies = {"demo_sleep": {"priority": 5, "attempts": 3, "max_concurrent": 2, "timeout": 90}}
    with override_settings(JOBSITE={"SPARK_JOB_POLICIES": policies}):
        first = trigger_run("demo_sleep", {}, trigger="orm")
        second = trigger_run("demo_sleep", {}, trigger="orm", timeout=30)
        item = QueueItem.objects.get(id=first.item_id)
        assert (item.priority, item.max_attempts, first.timeout) == (5, 3, 90)
        assert item.ordering_key == f"spark-job:demo_sleep:{first.id % 2}"
        assert QueueItem.objects.get(id=second.item_id).ordering_key != item.ordering_key  # the other lane
        assert second.timeout == 30  # a trigger's own timeout wins
        # A queued run behind a started one in its lane says what it waits for.
        third = trigger_run("demo_sleep", {}, trigger="orm")
        SparkRun.objects.filter(id=first.id).update(state="running")
        assert waiting_for(SparkRun.objects.get(id=third.id)).id == first.id
        assert waiting_for(SparkRun.objects.get(id=second.id)) is None
    plain = trigger_run("demo_sleep", {}, trigger="orm")
    assert QueueItem.objects.get(id=plain.item_id).ordering_key is None  # no limit, no lane


def _ctx(attempt, max_attempts):
    return Context(1, 1, attempt, max_attempts, "queue_app.spark_run", "spark", Delivery.AT_LEAST_ONCE, "w")


def test_only_the_ends_a_policy_names_are_retried_while_attempts_remain():
    failed, timed_out = LaunchResult("failed", returncode=1), LaunchResult("timed_out", returncode=-15)
    default = SparkPolicy()
    assert retried(failed, default, _ctx(1, 3)) and not retried(timed_out, default, _ctx(1, 3))
    assert not retried(failed, default, _ctx(3, 3))  # no attempt left
    assert not retried(LaunchResult("failed", returncode=None), default, _ctx(1, 3))  # could not start
    both = SparkPolicy(retry_on=("failed", "timed_out"))
    assert retried(timed_out, both, _ctx(1, 2))
    assert not retried(failed, SparkPolicy(retry_on=()), _ctx(1, 3))


def test_history_past_a_jobs_retention_is_pruned_with_its_event_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBSITE_SPARK_EVENT_LOG_DIR", str(tmp_path))
    now = timezone.now()
    old = SparkRun.objects.create(job="demo_sleep", state="succeeded", finished_at=now - dt.timedelta(days=3))
    recent = SparkRun.objects.create(job="demo_sleep", state="failed", finished_at=now - dt.timedelta(hours=1))
    other = SparkRun.objects.create(job="file_rollup", state="succeeded", finished_at=now - dt.timedelta(days=30))
    for run in (old, recent):
        os.makedirs(eventlog.run_dir(run.id))
    with override_settings(JOBSITE={"SPARK_JOB_POLICIES": {"demo_sleep": {"keep_days": 2}}}):
        assert prune_runs() == 1
    assert set(SparkRun.objects.values_list("id", flat=True)) == {recent.id, other.id}
    assert not os.path.exists(eventlog.run_dir(old.id)) and os.path.exists(eventlog.run_dir(recent.id))


def test_a_stored_scripts_policy_is_checked_when_saved(tmp_path, monkeypatch):
    (tmp_path / "s.py").write_text("print(1)\n")
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    row = SparkScript(name="s", path=str(tmp_path / "s.py"), policy={"max_concurrent": "one"})
    with pytest.raises(SparkParamError) as refused:
        save_script(row, actor="a")
    assert "max_concurrent must be a whole number" in refused.value.errors["policy"]
    row.policy = {"max_concurrent": 1, "keep_days": 7}
    save_script(row, actor="a")
    assert policy_for(get_job("s")).max_concurrent == 1
