"""The demo's datasets (issue 38): demo_pipeline's declarations pass the system checks under the default roots and
under any other, `dataset lineage` of the rollup shows the chain, and the sample data's bad day warns and blocks
(its files written as the demo's steps write them, observed, the checks run in-process on real pandas frames).
A demo run recording its materializations is tests/workflows/spark/test_workflow_spark.py's demo test (the one JVM
run)."""

import datetime as dt
import io
import json
import os

import pytest
from django.core import checks
from django.core.management import call_command

from jobsite.demo import data as demo_data
from jobsite.demo.pipeline import _spoil
from queue_app.datasets.checks_run import run_check
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import DatasetCheckResult
from queue_app.datasets.services import observe
from queue_app.datasets.spark_runs import users
from queue_app.spark.pipelines.file_rollup import SAMPLE_REGIONS, write_sample_input
from queue_app.spark.registry import get_job

pytestmark = pytest.mark.django_db


def _dataset_errors() -> list[str]:
    return [f"{m.id}: {m.msg}" for m in checks.run_checks() if m.id and m.id.startswith("jobsite.E1")]


def test_the_demos_declarations_pass_the_system_checks_under_the_default_and_other_roots(tmp_path, monkeypatch):
    assert _dataset_errors() == []
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))  # relative locations: under the first root, whatever it is
    assert _dataset_errors() == []
    assert demo_data.demo_dir("input") == os.path.join(os.path.realpath(tmp_path), "demo_pipeline", "input")


def test_dataset_lineage_of_the_rollup_shows_the_demos_chain():
    out = io.StringIO()
    call_command("dataset", "lineage", "demo.rollup", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "dataset": "demo.rollup",
        "upstream": ["demo.events"],
        "downstream": ["demo.analytics"],
        "jobs": ["demo_analytics", "demo_rollup"],
    }
    assert users()["demo.rollup"] == {"producers": ["demo_rollup"], "consumers": ["demo_analytics"]}
    assert get_job("demo_rollup").produces[0].param == "day" and get_job("demo_rollup").params != ()


def _write_day(day: dt.date) -> None:
    folder = demo_data.demo_dir("input", day.isoformat())
    for region in SAMPLE_REGIONS:
        [path] = write_sample_input(os.path.join(folder, f".tmp-{region}"), rows=200, days=1, start=day, seed=1)
        _spoil(path, day, region)
        os.replace(path, os.path.join(folder, f"events-{day}-{region}.csv"))
        os.rmdir(os.path.dirname(path))


def _checked(day: dt.date) -> tuple[str, dict[str, bool]]:
    _write_day(day)
    m = observe(demo_data.EVENTS, day)
    for name in ("every_region_sent_rows", "quantities_positive"):
        state = run_check(m.id, name)["checks"]
    results = DatasetCheckResult.objects.filter(materialization_id=m.id)
    return state, {r.check_name: r.passed for r in results}


def test_the_sample_datas_bad_day_warns_and_blocks_and_an_ordinary_day_passes(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    assert _checked(dt.date(2025, 1, 12)) == ("passed", {"every_region_sent_rows": True, "quantities_positive": True})
    state, passed = _checked(demo_data.BAD_DAY)
    assert (state, passed) == ("failed", {"every_region_sent_rows": False, "quantities_positive": False})
    messages = dict(
        DatasetCheckResult.objects.filter(partition=demo_data.BAD_DAY.isoformat()).values_list("check_name", "message")
    )
    assert messages["every_region_sent_rows"] == f"no rows in events-{demo_data.BAD_DAY}-west.csv"
    assert messages["quantities_positive"] == "20 row(s) with quantity below 1"
