"""A Spark program's own figures (issue 38): jobsite/spark_report.py appends reports to the channel the launcher
names (JOBSITE_SPARK_REPORT), and the run's success records them: the reported rows replace the event log's,
metadata and a preview are added, reports of partitions the run does not produce are left out. In-process: the
writer as a script calls it, the reader and merger as runs._finish calls them (output_figures, record_outputs)."""

import datetime as dt
import json

import pytest
from django.db import transaction

from jobsite import spark_report
from queue_app.datasets import dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.spark_runs import output_figures, record_outputs
from queue_app.params import Param
from queue_app.spark import script_report
from queue_app.spark.registry import _jobs, get_job, spark_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A daily dataset under a tmp root, a job producing it, the event logs (and channels) under tmp_path."""
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path / "data"))
    monkeypatch.setenv("JOBSITE_SPARK_EVENT_LOG_DIR", str(tmp_path / "events"))
    datasets, jobs = set(_code.entries()), set(_jobs.entries())
    dataset("rep_daily", location="rep/{partition}", partitioning="daily")
    spark_job("rep_job", params=[Param("day", "date", required=True)], produces={"rep_daily": "day"})(lambda s, p: {})
    yield get_job("rep_job")
    for name in set(_code.entries()) - datasets:
        _code.unregister(name)
    for name in set(_jobs.entries()) - jobs:
        _jobs.unregister(name)


def test_the_channels_two_ends_agree():
    """The writer a script imports (plain Python, no app) and the Spark app's reader name the same channel."""
    assert (spark_report.ENV, spark_report.PREVIEW_ROWS) == (script_report.ENV, script_report.PREVIEW_ROWS)
    assert script_report.ENV == "JOBSITE_SPARK_REPORT"


def test_outside_jobsite_a_report_does_nothing_and_bad_figures_are_refused(monkeypatch, tmp_path):
    monkeypatch.delenv(spark_report.ENV, raising=False)
    assert spark_report.materialized("events", "2026-11-26", rows=3) is False
    monkeypatch.setenv(spark_report.ENV, str(tmp_path / "r.jsonl"))
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="rows is a whole number"):
            spark_report.materialized("events", rows=bad)
    assert not (tmp_path / "r.jsonl").exists()


def test_a_succeeded_runs_reports_replace_its_rows_and_add_metadata_and_a_preview(job, monkeypatch):
    run_id = 9001
    monkeypatch.setenv(spark_report.ENV, script_report.prepare(run_id))
    spark_report.materialized("rep_daily", dt.date(2026, 11, 26), rows=5, metadata={"source": "a"})
    spark_report.materialized(
        "rep_daily", "2026-11-26", rows=7, metadata={"late": 2}, preview=[{"k": i} for i in range(30)]
    )
    spark_report.materialized("rep_daily", "2026-11-25", rows=1)  # not this run's partition: left out
    with open(script_report.channel(run_id), "a") as f:
        f.write("not json\n")  # a line that cannot be read is skipped

    outputs = output_figures(job, {"day": "2026-11-26"}, run_id, None)
    with transaction.atomic():
        record_outputs(outputs, run_id, job.name)

    m = Materialization.objects.get(dataset="rep_daily")
    assert (m.partition, m.rows, m.spark_run_id) == ("2026-11-26", 7, run_id)
    assert m.metadata["source"] == "a" and m.metadata["late"] == 2 and m.metadata["job"] == "rep_job"
    assert m.metadata["preview"] == [{"k": i} for i in range(spark_report.PREVIEW_ROWS)]


def test_an_unmodified_program_reports_nothing_and_an_earlier_attempts_reports_are_dropped(job, monkeypatch):
    run_id = 9002
    monkeypatch.setenv(spark_report.ENV, script_report.prepare(run_id))
    spark_report.materialized("rep_daily", "2026-11-26", rows=99)  # the first attempt, which failed
    script_report.prepare(run_id)  # the next attempt starts
    [out] = output_figures(job, {"day": "2026-11-26"}, run_id, None)
    assert out["rows"] is None and "metadata" not in out
    assert json.dumps(script_report.read(run_id)) == "{}"
