"""trigger_producer_when_stale (issue 38: "a dataset past its freshness policy is stale ... and optionally
triggers its producer"): the stale check that records a dataset's staleness episode starts its producer for the
wanted partition in the same transaction, so once per episode.

- two real workers running six stale checks at once (and their schedulers): the producer task runs exactly once,
  for the stale partition; a new episode (materialized, stale again) runs it once more;
- a Spark job producing a partition_by dataset: one run queued for the day due now (no Spark needed: the run
  stays queued);
- no producer: the episode and its event commit, the error is on the episode row;
- jobsite.E111: the option without a producer, with several, or without a freshness policy; the option in
  settings, and a value that is not a bool refused (E105).
"""

import datetime as dt
import json

import pytest
from django.core import checks
from django.test import override_settings
from django.utils import timezone

from queue_app.datasets import Freshness, dataset
from queue_app.datasets.checks import dataset_declarations, stale_producer_declarations
from queue_app.datasets.declarations import _code, get_dataset
from queue_app.datasets.models import Materialization, StaleEpisode
from queue_app.datasets.producers import forget_task, producer_task
from queue_app.datasets.services import record_materialization
from queue_app.datasets.stale import publish_stale
from queue_app.models import QueueItem
from queue_app.params import Param
from queue_app.registry import get_task
from queue_app.spark.models import SparkRun
from queue_app.spark.registry import _jobs, spark_job
from queue_app.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.support.waiting import drained
from tests.tasks import stale_producer_tasks

DAY = "2026-11-20"


@pytest.fixture
def fresh_names():
    """Forget the datasets a test declares."""
    before = set(_code.entries())
    yield
    for name in set(_code.entries()) - before:
        _code.unregister(name)


def backdate(materialization, hours: float) -> dt.datetime:
    at = timezone.now() - dt.timedelta(hours=hours)
    Materialization.objects.filter(id=materialization.id).update(at=at)
    return at


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_checking_at_once_start_the_producer_once_per_episode(worker):
    stale_producer_tasks.declare()
    try:
        first_at = backdate(record_materialization("sp_daily", DAY), 3)
        staleness = get_task("queue_app.dataset_staleness")
        for _ in range(6):
            staleness.enqueue({})
        for name in ("sp1", "sp2"):
            worker(name, "--concurrency", "3", "--pool", "thread", "--import", "tests.tasks.stale_producer_declared")
        drained(120)  # the checks, and the producer's item queued by the one that recorded the episode
        (episode,) = StaleEpisode.objects.filter(dataset="sp_daily")
        assert episode.overdue_since == first_at + dt.timedelta(hours=1)
        (built,) = Materialization.objects.filter(dataset="sp_built")
        assert built.partition == DAY and built.metadata["reason"].startswith("stale dataset sp_daily")
        assert (episode.partition, episode.started, episode.error) == (DAY, [f"item:{built.item_id}"], "")
        assert QueueItem.objects.filter(task="tests.sp_build").count() == 1
        assert QueueItem.objects.filter(task="queue_app.dataset_staleness", state="done").count() >= 6

        # Materialized again, then stale again: a new episode, one more run.
        second_at = backdate(record_materialization("sp_daily", DAY), 2)
        for _ in range(4):
            staleness.enqueue({})
        drained(120)
        assert StaleEpisode.objects.filter(dataset="sp_daily").count() == 2
        assert Materialization.objects.filter(dataset="sp_built").count() == 2
        assert StaleEpisode.objects.get(dataset="sp_daily", overdue_since=second_at + dt.timedelta(hours=1)).started
    finally:
        stale_producer_tasks.undeclare()


@pytest.mark.django_db
def test_a_spark_producer_is_queued_for_the_day_due_and_no_producer_leaves_the_error(fresh_names):
    WebhookEndpoint.objects.create(url="https://example.com/hook", secret="whsec_test", event_types=["dataset.stale"])
    dataset(
        "sp_by_six",
        location="table:tests.sp_by_six",
        partitioning="daily",
        freshness=Freshness(partition_by="06:00"),
        trigger_producer_when_stale=True,
    )
    dataset(
        "sp_orphan",
        location="table:tests.sp_orphan",
        freshness=Freshness(max_age=dt.timedelta(hours=1)),
        trigger_producer_when_stale=True,
    )
    dataset("sp_quiet", location="table:tests.sp_quiet", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    spark_job("sp_make", params=[Param("day", "date", required=True)], produces={"sp_by_six": "day"})(lambda s, p: {})
    try:
        record_materialization("sp_by_six", "2026-01-01")
        for name in ("sp_orphan", "sp_quiet"):
            backdate(record_materialization(name), 3)
        now = timezone.now()
        due = Freshness(partition_by="06:00").due_partition(now)  # yesterday after 06:00 UTC, else the day before

        assert publish_stale(now) == ["sp_by_six", "sp_orphan", "sp_quiet"]
        (run,) = SparkRun.objects.all()
        assert (run.job, run.params, run.trigger) == ("sp_make", {"day": due}, "dataset")
        episodes = {e.dataset: e for e in StaleEpisode.objects.all()}
        assert episodes["sp_by_six"].started == [f"spark_run:{run.id}"]
        assert episodes["sp_by_six"].partition == due
        assert episodes["sp_orphan"].started == [] and "0 producers" in episodes["sp_orphan"].error
        assert episodes["sp_quiet"].partition is None  # not asked for: nothing started
        sent = [json.loads(b)["data"]["dataset"] for b in WebhookDelivery.objects.values_list("body", flat=True)]
        assert sorted(sent) == ["sp_by_six", "sp_orphan", "sp_quiet"]
        assert publish_stale(now) == [] and SparkRun.objects.count() == 1  # the same episodes: nothing again
    finally:
        _jobs.unregister("sp_make")


def test_jobsite_e111_reports_the_option_without_one_producer_or_without_a_policy(fresh_names):
    dataset("sp_none", location="table:tests.sp_none", trigger_producer_when_stale=True)
    dataset(
        "sp_two",
        location="table:tests.sp_two",
        freshness=Freshness(max_age=dt.timedelta(hours=1)),
        trigger_producer_when_stale=True,
    )
    dataset("sp_fine", location="table:tests.sp_fine", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    producer_task("tests.sp_two_a", produces=["sp_two"])
    producer_task("tests.sp_two_b", produces=["sp_two", "sp_fine"])
    try:
        found = [e for e in stale_producer_declarations() if "'sp_" in e.msg]
        assert all(isinstance(e, checks.Error) and e.id == "jobsite.E111" for e in found)
        messages = sorted(e.msg for e in found)
        assert len(messages) == 3, messages
        assert "sp_none" in messages[0] and "needs a freshness policy" in messages[0]
        assert "sp_none" in messages[1] and "nothing produces it" in messages[1]
        assert "sp_two" in messages[2] and "task:tests.sp_two_a, task:tests.sp_two_b" in messages[2]
    finally:
        forget_task("tests.sp_two_a")
        forget_task("tests.sp_two_b")


def test_settings_declare_the_option_and_refuse_a_value_that_is_not_a_bool():
    declared = {
        "sp_set": {
            "location": "table:tests.sp_set",
            "freshness": {"max_age_hours": 1},
            "trigger_producer_when_stale": True,
        },
        "sp_yes": {"location": "table:tests.sp_yes", "trigger_producer_when_stale": "yes"},
    }
    with override_settings(JOBSITE={"DATASETS": declared}):
        ds = get_dataset("sp_set")
        assert ds.trigger_producer_when_stale and ds.config()["trigger_producer_when_stale"] is True
        [e105] = [e.msg for e in dataset_declarations() if "sp_yes" in e.msg]
        assert e105 == "DATASETS['sp_yes'] is left out: dataset 'sp_yes': trigger_producer_when_stale is True or False"
        [e111] = [e.msg for e in stale_producer_declarations() if "sp_set" in e.msg]
        assert "nothing produces it" in e111
