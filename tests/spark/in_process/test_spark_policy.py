"""Per-job run policies: declared with the job, overridden by settings, applied to the run's queue item (priority,
attempts, concurrency lane, timeout), to its retries (which ends retry, after what backoff) and to its history
(retention); finished runs' event logs have a default retention.
The concurrency limit across real workers is proven in test_spark_policy_workers.py."""

import datetime as dt
import os

import pytest
from django.test import override_settings
from django.utils import timezone

from queue_app.conf import queue_settings
from queue_app.maintenance_tasks import prune
from queue_app.models import QueueItem
from queue_app.registry import Context, Delivery
from queue_app.spark import eventlog
from queue_app.spark.launcher import LaunchResult
from queue_app.spark.models import SparkRun, SparkScript
from queue_app.spark.policy import PolicyError, SparkPolicy, policy_for
from queue_app.spark.registry import SparkParamError, get_job
from queue_app.spark.runs import prune_event_logs, prune_runs, retried, trigger_run, waiting_for
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
        ({"backoff_base": -1}, "backoff_base must be a number of seconds from 0 to 86400"),
        ({"backoff_max": "60"}, "backoff_max must be a number of seconds"),
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


def test_a_jobs_backoff_base_and_cap_set_the_delay_before_its_next_attempt():
    assert SparkPolicy().retry_in(1) is None  # the spark task's backoff, from the settings
    fixed = SparkPolicy(backoff_base=30, backoff_max=30)
    assert all(30 * (1 - queue_settings.BACKOFF_JITTER) <= fixed.retry_in(n) <= 30 for n in (1, 2, 5))
    capped = SparkPolicy(backoff_base=10, backoff_max=25)
    assert capped.retry_in(4) <= 25 and capped.retry_in(1) <= 10 * (1 + queue_settings.BACKOFF_JITTER)
    assert SparkPolicy.from_mapping({"backoff_base": 0.5}).backoff_base == 0.5


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


def test_event_logs_of_jobs_without_retention_are_pruned_after_the_default_days(tmp_path, monkeypatch):
    # The shipped prune task (the "prune-done" schedule's target) applies the default: a run finished 15 days
    # ago loses its event log but keeps its row; a recent one and a job with its own keep_days keep theirs; a
    # directory whose run no longer exists goes once it is as old.
    monkeypatch.setenv("JOBSITE_SPARK_EVENT_LOG_DIR", str(tmp_path))
    now = timezone.now()
    old = SparkRun.objects.create(job="demo_sleep", state="succeeded", finished_at=now - dt.timedelta(days=15))
    recent = SparkRun.objects.create(job="demo_sleep", state="failed", finished_at=now - dt.timedelta(days=13))
    running = SparkRun.objects.create(job="demo_sleep", state="running")
    own = SparkRun.objects.create(job="file_rollup", state="succeeded", finished_at=now - dt.timedelta(days=20))
    for run in (old, recent, running, own):
        os.makedirs(eventlog.run_dir(run.id))
    gone_old, gone_new = eventlog.run_dir(own.id + 100), eventlog.run_dir(own.id + 101)
    os.makedirs(gone_old), os.makedirs(gone_new)
    stamp = (now - dt.timedelta(days=15)).timestamp()
    os.utime(gone_old, (stamp, stamp))
    stray = tmp_path / "not-a-run"
    stray.mkdir()
    with override_settings(JOBSITE={"SPARK_JOB_POLICIES": {"file_rollup": {"keep_days": 30}}}):
        result = prune(None, None)
    assert result["spark_event_logs"] == 2 and result["spark_runs"] == 0
    kept = {run.id for run in (old, recent, running, own) if os.path.exists(eventlog.run_dir(run.id))}
    assert kept == {recent.id, running.id, own.id}
    assert not os.path.exists(gone_old) and os.path.exists(gone_new) and stray.exists()
    assert SparkRun.objects.filter(id=old.id).exists()  # the run's row stays
    with override_settings(JOBSITE={"SPARK_EVENT_LOG_KEEP_DAYS": 0}):  # 0: kept until the run is deleted
        SparkRun.objects.filter(id=recent.id).update(finished_at=now - dt.timedelta(days=400))
        assert prune_event_logs() == 0 and os.path.exists(eventlog.run_dir(recent.id))


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


def test_a_workflow_spark_steps_item_carries_its_jobs_attempts_and_priority():
    """A Spark step is retried as its job's policy says, as a run triggered on its own is (an outside reader
    found a script with attempts 1 retried as a step, under the workflow's DEFAULT_MAX_ATTEMPTS)."""
    from queue_app.workflows import services
    from queue_app.workflows.definition import Graph
    from queue_app.workflows.models import WorkflowStep

    with override_settings(JOBSITE={"SPARK_JOB_POLICIES": {"demo_sleep": {"priority": 5, "attempts": 1}}}):
        graph = Graph("policy-step")
        graph.spark("demo_sleep", {"tasks": 1, "seconds": 0.1}, name="spark")
        workflow = services.start_graph(graph, started_by="test")
    step = WorkflowStep.objects.get(workflow=workflow, name="spark")
    item = QueueItem.objects.get(id=step.item_id)
    assert (item.max_attempts, item.priority) == (1, 5)
