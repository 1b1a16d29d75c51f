"""OpenLineage settings (issue 38): off by default (nothing built, nothing sent), a file transport from settings
writes the event after the transaction commits (none on rollback), and a setting the client cannot use is the
system check jobsite.E131."""

import json

import pytest
from django.db import transaction

from queue_app.datasets import dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.openlineage import check_openlineage, flush
from queue_app.datasets.spark_lineage import emit_run, run_event
from queue_app.params import Param
from queue_app.spark import spark_job
from queue_app.spark.registry import _jobs
from queue_app.spark.runs import trigger_run


@pytest.fixture
def job():
    datasets_before, jobs_before = set(_code.entries()), set(_jobs.entries())
    dataset("olc_in", location="table:raw.olc_in")
    dataset("olc_out", location="table:mart.olc_out", partitioning="daily")

    @spark_job(
        "olc_job", params=[Param("day", "date", required=True)], consumes=["olc_in"], produces={"olc_out": "day"}
    )
    def build(spark, params): ...

    yield trigger_run("olc_job", {"day": "2026-11-26"}, trigger="orm")
    for name in set(_jobs.entries()) - jobs_before:
        _jobs.unregister(name)
    for name in set(_code.entries()) - datasets_before:
        _code.unregister(name)


@pytest.mark.django_db(transaction=True)
def test_off_by_default_and_a_file_transport_writes_after_commit_only(job, settings, tmp_path):
    assert run_event(job, "START") is None  # no setting: nothing is built
    out = tmp_path / "lineage.jsonl"
    settings.JOBSITE = {
        **settings.JOBSITE,
        "OPENLINEAGE": {"transport": {"type": "file", "log_file_path": str(out), "append": True}},
    }
    assert check_openlineage() == []

    with pytest.raises(RuntimeError), transaction.atomic():
        emit_run(job, "failed", error="boom")
        raise RuntimeError("rolled back")
    with transaction.atomic():
        emit_run(job, "succeeded", outputs=[{"dataset": "olc_out", "rows": 7, "bytes": 70, "files": None}])
        assert not out.exists()  # not before the commit
    assert flush(10)

    [event] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (event["eventType"], event["job"]["name"]) == ("COMPLETE", "olc_job")
    assert event["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 7
    assert "parent" not in event["run"]["facets"]  # not a workflow's step


@pytest.mark.parametrize(
    "value, message",
    [
        ("http://x", "OPENLINEAGE is None (off) or a mapping"),
        ({"transport": {"type": "kafka"}}, "whose type is one of ('http', 'file', 'console')"),
        ({"transport": {"type": "console"}, "namespace": ""}, "OPENLINEAGE['namespace'] is a non-empty string"),
        ({"transport": {"type": "console"}, "queue_size": 0}, "queue_size"),
        ({"transport": {"type": "console"}, "extra": 1}, "unknown keys ['extra']"),
        ({"transport": {"type": "http"}}, "url"),
    ],
)
def test_a_bad_setting_is_system_check_e131(settings, value, message):
    settings.JOBSITE = {**settings.JOBSITE, "OPENLINEAGE": value}

    [error] = check_openlineage()

    assert error.id == "jobsite.E131" and message in error.msg
