"""Spark jobs and scripts declaring the datasets they produce and consume, without a JVM: the declaration shapes,
the system check jobsite.E106, a stored (admin) script's declarations checked when saved, a trigger whose
partition does not fit (refused, nothing queued), and `dataset show` naming the producers and consumers. The
runs themselves: tests/datasets/spark/test_datasets_spark_runs.py."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from queue_app.datasets import DatasetError, StaticPartitions, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.refs import DatasetRef
from queue_app.datasets.spark_runs import job_datasets
from queue_app.models import QueueItem
from queue_app.params import Param
from queue_app.spark import SparkParamError
from queue_app.spark.models import SparkRun, SparkScript
from queue_app.spark.registry import _jobs, spark_job
from queue_app.spark.runs import trigger_run
from queue_app.spark.scripts import ROOTS_ENV as SCRIPT_ROOTS_ENV
from queue_app.spark.scripts import ScriptError, save_script, script_job


def noop(spark, params):
    return {}


@pytest.fixture
def declared(tmp_path, monkeypatch):
    """Datasets and jobs a test declares are taken away after it (other tests run the system checks)."""
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    datasets_before, jobs_before = set(_code.entries()), set(_jobs.entries())
    dataset("dsx_events", location="events/day={partition}", partitioning="daily")
    dataset("dsx_revenue", location="revenue/day={partition}", partitioning="daily")
    dataset("dsx_regions", location="regions/{partition}", partitioning=StaticPartitions(["eu", "us"]))
    dataset("dsx_rollup", location="rollup")
    yield tmp_path
    for name in set(_jobs.entries()) - jobs_before:
        _jobs.unregister(name)
    for name in set(_code.entries()) - datasets_before:
        _code.unregister(name)


def e106(job_name):
    return [m.msg for m in job_datasets() if m.id == "jobsite.E106" and f"Spark job {job_name!r}" in m.msg]


def test_a_job_and_a_script_declare_what_they_produce_and_consume_as_names_or_a_mapping(declared):
    spark_job(
        "dsx_daily",
        params=[Param("day", "date", required=True)],
        produces={"dsx_revenue": "day"},
        consumes=["dsx_events", ("dsx_regions", None)],
    )(noop)
    job = _jobs.get("dsx_daily")
    assert job.produces == (DatasetRef("dsx_revenue", "day"),)
    assert job.consumes == (DatasetRef("dsx_events"), DatasetRef("dsx_regions"))
    assert e106("dsx_daily") == []
    # The settings' JSON form of a script: the same shapes.
    script = script_job(
        "dsx_script", path="x.py", params=[{"name": "day", "type": "date"}], produces={"dsx_revenue": "day"}
    )
    assert script.produces == (DatasetRef("dsx_revenue", "day"),)
    with pytest.raises(DatasetError, match="not a string"):
        spark_job("dsx_bad", produces="dsx_revenue")
    with pytest.raises(DatasetError, match="names a dataset twice"):
        spark_job("dsx_bad", produces=["dsx_rollup", "dsx_rollup"])
    with pytest.raises(ScriptError, match="neither a dataset name nor"):
        script_job("dsx_bad_script", path="x.py", consumes=[{"dsx_rollup": 1}])
    assert _jobs.get("dsx_bad") is None


def test_bad_declarations_are_found_by_the_system_check(declared):
    day = [Param("day", "date", required=True)]
    spark_job("dsx_unknown", params=day, produces={"dsx_revenu": "day"})(noop)
    spark_job("dsx_no_param", params=day, produces={"dsx_revenue": "date"})(noop)
    spark_job("dsx_unpartitioned", params=day, produces={"dsx_rollup": "day"})(noop)
    spark_job("dsx_which", params=day, produces=["dsx_revenue"], consumes=["dsx_events"])(noop)
    [unknown] = e106("dsx_unknown")
    assert "unknown dataset 'dsx_revenu'" in unknown and "dsx_revenue" in unknown  # the close name
    assert e106("dsx_no_param") == [
        "Spark job 'dsx_no_param' produces: dataset 'dsx_revenue': the partition parameter 'date' is not a "
        "declared parameter"
    ]
    assert e106("dsx_unpartitioned") == [
        "Spark job 'dsx_unpartitioned' produces: dataset 'dsx_rollup' is not partitioned: it takes no partition "
        "parameter"
    ]
    # Producing a partitioned dataset needs the parameter; consuming one without it reads every partition.
    assert e106("dsx_which") == [
        "Spark job 'dsx_which' produces: dataset 'dsx_revenue' is partitioned: say which parameter names the partition"
    ]
    with pytest.raises(SystemCheckError, match="jobsite.E106"):
        call_command("check")


@pytest.mark.django_db
def test_a_trigger_whose_partition_does_not_fit_is_refused_and_queues_nothing(declared):
    spark_job(
        "dsx_regional",
        params=[Param("region", "str", required=True)],
        produces={"dsx_regions": "region"},
    )(noop)
    spark_job("dsx_by_day", params=[Param("day", "str")], produces={"dsx_revenue": "day"})(noop)
    with pytest.raises(SparkParamError) as refused:
        trigger_run("dsx_regional", {"region": "asia"}, trigger="orm")
    assert set(refused.value.errors) == {"region"}
    assert "'asia' is not a partition of dataset 'dsx_regions'" in refused.value.errors["region"]
    with pytest.raises(SparkParamError, match="day: 'yesterday' is not a partition of dataset 'dsx_revenue'"):
        trigger_run("dsx_by_day", {"day": "yesterday"}, trigger="orm")
    with pytest.raises(SparkParamError, match="day: no value, and it names the partition of dataset 'dsx_revenue'"):
        trigger_run("dsx_by_day", {}, trigger="orm")
    spark_job("dsx_ghost", produces=["dsx_undeclared"])(noop)  # E106 says so; a trigger is refused too
    with pytest.raises(SparkParamError, match="unknown dataset 'dsx_undeclared'"):
        trigger_run("dsx_ghost", {}, trigger="orm")
    assert not SparkRun.objects.exists() and not QueueItem.objects.exists()
    run = trigger_run("dsx_regional", {"region": "eu"}, trigger="orm")
    assert run.item_id and SparkRun.objects.count() == 1


@pytest.mark.django_db
def test_dataset_show_names_the_jobs_that_produce_and_consume_it(declared, capsys):
    day = [Param("day", "date", required=True)]
    spark_job("dsx_make", params=day, produces={"dsx_revenue": "day"}, consumes=["dsx_events"])(noop)
    spark_job("dsx_read", consumes={"dsx_revenue": None})(noop)
    spark_job("dsx_read_day", params=day, consumes={"dsx_revenue": "day"})(noop)
    call_command("dataset", "show", "dsx_revenue", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert (shown["producers"], shown["consumers"]) == (["dsx_make"], ["dsx_read", "dsx_read_day"])
    call_command("dataset", "show", "dsx_events", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert (shown["producers"], shown["consumers"]) == ([], ["dsx_make"])


@pytest.mark.django_db
def test_a_stored_script_declares_its_datasets_checked_when_saved(declared, monkeypatch, capsys):
    (declared / "job.py").write_text("print('hi')\n")
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(declared))
    row = SparkScript(
        name="dsx_stored",
        path=str(declared / "job.py"),
        params=[{"name": "day", "type": "date", "required": True}],
        produces={"dsx_revenue": "date"},
        consumes=["dsx_nowhere"],
    )
    with pytest.raises(SparkParamError) as refused:
        save_script(row, actor="ana")
    assert "the partition parameter 'date' is not a declared parameter" in refused.value.errors["produces"]
    assert "unknown dataset 'dsx_nowhere'" in refused.value.errors["consumes"]
    assert not SparkScript.objects.exists()
    row.produces, row.consumes = {"dsx_revenue": "day"}, ["dsx_events"]
    save_script(row, actor="ana")
    call_command("dataset", "show", "dsx_revenue", "--json")
    assert json.loads(capsys.readouterr().out)["producers"] == ["dsx_stored"]
