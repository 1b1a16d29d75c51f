"""Datasets in the admin (issue 38): the list (partitions, last materialized, freshness), a dataset's page
(partition grid by state, the materialization chart and table, the lineage drawn by Graphviz with freshness on
its nodes, failed-check partitions on the grid, an edge read through a mapping labelled with it), the full lineage
page, and observe and materialize behind their permissions, logged, refused without them."""

import datetime as dt
import html
import json
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from queue_app.datasets import MultiPartitions, StaticPartitions, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.mappings import AllOf, StaticMap, TimeWindow
from queue_app.datasets.models import Materialization
from queue_app.datasets.services import record_materialization
from queue_app.datasets.sync import sync_datasets
from queue_app.models import QueueItem
from queue_app.params import Param
from queue_app.spark.models import SparkRun
from queue_app.spark.registry import _jobs, spark_job
from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
)
from tests.tasks import datasets_declared, datasets_lineage_declared  # noqa: F401  (declare the datasets and jobs)

pytestmark = pytest.mark.django_db


def url(view: str, *args) -> str:
    return reverse(f"admin:jobsite_datasets_dataset_{view}", args=args)


@pytest.fixture
def ds_client(django_user_model, tmp_path, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    sync_datasets()

    def make(*codenames: str, username: str = "data", csrf: bool = False) -> Client:
        user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label__in=JOBSITE_LABELS, codename__in=["view_dataset", *codenames]
            )
        )
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return make


def test_the_list_shows_partitions_last_materialized_and_freshness(ds_client):
    now = timezone.now()
    for day in ("2026-11-24", "2026-11-25", "2026-11-25"):
        record_materialization("events", day, rows=5)
    record_materialization("events", now, rows=1)  # today's partition: fresh
    old = record_materialization("rollup", rows=3)
    Materialization.objects.filter(id=old.id).update(at=now - dt.timedelta(hours=27))

    page = ds_client().get(url("changelist")).content.decode()

    rows = {
        m[0]: m[1] for m in re.findall(r'<th class="field-name"><a href="[^"]+">([\w.-]+)</a></th>(.*?)</tr>', page)
    }
    assert 'class="field-partitions">3<' in rows["events"] and "state-fresh" in rows["events"]
    assert 'class="field-partitions">1<' in rows["rollup"] and "state-stale" in rows["rollup"]
    assert 'class="field-partitions">0<' in rows["regions"] and "state-missing" in rows["regions"]
    assert "state-missing" in rows["ln_daily"] and "never" in rows["ln_daily"]


def test_the_dataset_page_draws_the_grid_the_chart_and_the_lineage_with_freshness(ds_client):
    run = record_materialization("ln_daily", rows=10, bytes=2048, spark_run_id=41)
    record_materialization("ln_daily", rows=12, bytes=4096)
    client = ds_client()

    page = client.get(url("change", "ln_daily")).content.decode()

    assert 'id="ds-partitions"' in page and "state-materialized" in page
    figure = json.loads(re.search(r'<script id="ds-figure" type="application/json">(.*?)</script>', page).group(1))
    assert [t["name"] for t in figure["data"]] == ["rows", "bytes"]
    assert figure["data"][0]["y"] == [10, 12] and figure["data"][1]["y"] == [2048, 4096]
    assert (
        reverse("admin:jobsite_spark_sparkrun_change", args=[run.spark_run_id]) in figure["data"][0]["customdata"][0][0]
    )
    assert reverse("admin:queue_app_queue_plotly_js") in page and "cdn" not in page.lower()
    lineage = re.search(r'<div class="ds-graph" id="ds-lineage">(.*?)</div>', page, re.S).group(1)
    assert lineage.startswith("<svg") and "ln_agg_job" in lineage and "ln_report" in lineage
    assert "ln_raw" in lineage  # two hops up: ln_daily <- ln_agg_job <- ln_clean <- ln_clean_job <- ln_raw
    assert "freshness&#45;unknown" in lineage and "Observe</a>" not in page  # no permission, no button

    whole = client.get(url("lineage", "ln_raw")).content.decode()
    assert "0 upstream, 4 downstream datasets, 4 jobs" in whole and "ln_report_job" in whole
    assert client.get(url("change", "no_such")).status_code == 404
    assert client.get(url("change", "ln_daily") + "?partition=").status_code == 200


def test_the_history_table_pages_past_its_rows_and_the_grid_marks_the_chosen_partition(ds_client):
    for _ in range(52):
        record_materialization("events", "2026-11-24", rows=5)
    record_materialization("events", "2026-11-25", rows=7)
    client = ds_client()

    first = client.get(url("change", "events")).content.decode()
    second = client.get(url("change", "events") + "?hp=2").content.decode()
    chosen = client.get(url("change", "events") + "?partition=2026-11-24&hp=2").content.decode()

    def rows(page):
        table = re.search(r'<div class="module" id="ds-history">(.*?)</div>', page, re.S).group(1)
        return re.findall(r"<td>(2026-11-2\d)</td>", table)

    assert rows(first) == ["2026-11-25"] + ["2026-11-24"] * 49 and "?hp=2" in first and ">newer<" not in first
    assert rows(second) == ["2026-11-24"] * 3 and "?hp=1" in second and ">older<" not in second
    assert rows(chosen) == ["2026-11-24"] * 2
    grid = re.search(r'<div class="ds-grid" id="ds-partitions">(.*?)</div>', chosen, re.S).group(1)
    assert 'href="?partition=2026-11-24" class="state-materialized selected"' in grid
    assert 'title="2026-11-25: materialized at ' in grid and ", 7 rows" in grid


def test_observe_needs_its_permission_records_the_files_and_is_logged(ds_client, tmp_path):
    day = tmp_path / "events" / "day=2026-11-26"
    day.mkdir(parents=True)
    (day / "part-0.parquet").write_bytes(b"x" * 300)
    viewer = ds_client(username="viewer")
    assert viewer.get(url("observe", "events")).status_code == 403
    assert viewer.post(url("observe", "events"), {"partition": "2026-11-26"}).status_code == 403
    assert not Materialization.objects.exists()

    observer = ds_client("observe_dataset", csrf=True)
    assert observer.post(url("observe", "events"), {"partition": "2026-11-26"}).status_code == 403  # no CSRF token
    form = observer.get(url("observe", "events"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.content.decode()).group(1)
    bad = observer.post(url("observe", "events"), {"partition": "2026-13-01", "csrfmiddlewaretoken": token})
    assert bad.status_code == 200 and "is not a daily partition" in bad.content.decode()
    assert not Materialization.objects.exists()

    done = observer.post(url("observe", "events"), {"partition": "2026-11-26", "csrfmiddlewaretoken": token})

    assert done.status_code == 302
    row = Materialization.objects.get()
    assert (row.dataset, row.partition, row.source, row.files, row.bytes) == (
        "events",
        "2026-11-26",
        "observed",
        1,
        300,
    )
    assert LogEntry.objects.get().change_message == "Observed events[2026-11-26]: 1 files, 300 bytes"
    assert "Observe</a>" in observer.get(url("change", "events")).content.decode()


def test_materialize_needs_the_trigger_permission_queues_the_producer_and_is_logged(ds_client):
    viewer = ds_client(username="viewer")
    assert viewer.get(url("materialize", "ln_daily")).status_code == 403
    assert viewer.post(url("materialize", "ln_daily"), {}).status_code == 403
    assert "Materialize</a>" not in viewer.get(url("change", "ln_daily")).content.decode()

    runner = ds_client("trigger_sparkrun")
    assert "Materialize</a>" in runner.get(url("change", "ln_daily")).content.decode()
    refused = runner.post(url("materialize", "ln_raw"), {})  # nothing produces ln_raw
    assert refused.status_code == 200 and "nothing produces it" in refused.content.decode()
    assert not SparkRun.objects.exists()

    done = runner.post(url("materialize", "ln_daily"), {})

    assert done.status_code == 302
    run = SparkRun.objects.get()
    assert (run.job, run.trigger) == ("ln_agg_job", "dashboard")
    assert LogEntry.objects.get().change_message == f"Materialize ln_daily: 1 partitions, runs {run.id}"


def test_materialize_takes_params_over_the_declarations_and_refuses_a_malformed_line(ds_client, tmp_path):
    """Issue 50: the demo's rollup from the admin: its declared params and the form's, one NAME=VALUE a line."""
    runner = ds_client("trigger_sparkrun")
    day = "2026-11-30"
    (tmp_path / "demo_pipeline" / "input" / day).mkdir(parents=True)
    bad = runner.post(url("materialize", "demo.rollup"), {"partition": day, "params": "keys=region\nformat"})
    assert bad.status_code == 200 and "a parameter takes NAME=VALUE, not &#x27;format&#x27;" in bad.content.decode()
    unknown = runner.post(url("materialize", "demo.rollup"), {"partition": day, "params": "nosuch=1"})
    assert unknown.status_code == 200 and "nosuch: unknown parameter" in unknown.content.decode()
    assert not SparkRun.objects.exists()

    done = runner.post(url("materialize", "demo.rollup"), {"partition": day, "params": "keys=region\n\n"})

    assert done.status_code == 302
    run = SparkRun.objects.get()
    root = str(tmp_path.resolve())
    assert (run.job, run.params["day"], run.params["keys"]) == ("demo_rollup", day, "region")
    assert run.params["input_dir"] == f"{root}/demo_pipeline/input/{day}"
    assert run.params["output_dir"] == f"{root}/demo_pipeline/rollup"


def test_materialize_of_a_dataset_a_task_produces_queues_the_task_and_logs_its_item(ds_client):
    """Issue 50: demo.events, produced by the task demo.write_events (@job(produces=)), from the admin's button:
    one item of the task for the partition, named in the LogEntry, no Spark run."""
    runner = ds_client("trigger_sparkrun")
    day = "2026-11-30"

    done = runner.post(url("materialize", "demo.events"), {"partition": day, "params": ""})

    assert done.status_code == 302, done.content.decode()[-2000:]
    item = QueueItem.objects.get(task="demo.write_events")
    assert (item.payload["dataset"], item.payload["partition"]) == ("demo.events", day)
    assert LogEntry.objects.get().change_message == f"Materialize demo.events: 1 partitions, items {item.id}"
    assert not SparkRun.objects.exists()


def test_the_grid_shows_a_partition_whose_blocking_checks_failed(ds_client):
    record_materialization("events", "2026-11-25", rows=5)
    failed = record_materialization("events", "2026-11-26", rows=5)
    Materialization.objects.filter(id=failed.id).update(checks="failed")

    page = ds_client().get(url("change", "events")).content.decode()

    assert re.search(r'href="\?partition=2026-11-26" class="state-failed-checks"', page)
    assert re.search(r'href="\?partition=2026-11-25" class="state-materialized"', page)


def test_the_grid_spans_the_range_that_exists_a_long_gap_is_one_cell_and_a_failed_day_outlives_the_limit():
    from jobsite.demo.data import BAD_DAY, EVENTS
    from queue_app.datasets import get_dataset
    from queue_app.datasets.checks_run import record_check_result
    from queue_app.datasets.models import DatasetCheckResult
    from queue_app.datasets.status import GRID_GAP, partition_grid

    sync_datasets()
    now = dt.datetime(2026, 12, 2, 9, tzinfo=dt.UTC)
    bad = record_materialization(EVENTS, BAD_DAY, bytes=10, observed=True)
    for check in DatasetCheckResult.objects.filter(materialization_id=bad.id):
        record_check_result(bad.id, check.check_name, passed=False, message="bad day")
    for day in (dt.date(2026, 11, 20), dt.date(2026, 11, 23), dt.date(2026, 11, 30)):
        record_materialization(EVENTS, day, bytes=10, observed=True)
    ds = get_dataset(EVENTS)

    cells = partition_grid(ds, now=now)
    shown = [(c.partition, c.state) for c in cells]
    gap = cells[1]
    assert shown[0] == ("2025-01-13", "failed-checks") and gap.state == "gap" and gap.count > GRID_GAP
    assert (gap.partition, gap.until) == ("2025-01-14", "2026-11-19")
    assert shown[2:] == [
        ("2026-11-20", "checks-pending"),  # its checks not run here
        ("2026-11-21", "missing"),
        ("2026-11-22", "missing"),
        ("2026-11-23", "checks-pending"),
        *[(f"2026-11-{d}", "missing") for d in range(24, 30)],
        ("2026-11-30", "checks-pending"),
        ("2026-12-01", "missing"),  # the last complete day, not yet materialized
    ]

    few = partition_grid(ds, limit=4, now=now)  # past the limit: the failed day keeps its cell
    assert [(c.partition, c.state) for c in few][0] == ("2025-01-13", "failed-checks")
    assert few[1].state == "older" and few[1].until == "2026-11-27"
    assert [c.partition for c in few[2:]] == ["2026-11-28", "2026-11-29", "2026-11-30", "2026-12-01"]


@pytest.fixture
def mapped_jobs():
    """Consumers reading their upstreams through each kind of mapping (issue 48), and one through identity."""
    datasets_before, jobs_before = set(_code.entries()), set(_jobs.entries())
    regions = MultiPartitions(day="daily", region=StaticPartitions(["eu", "us"]))
    for name, partitioning in {
        "lm_days": "daily",
        "lm_trailing": "daily",
        "lm_plain": "daily",
        "lm_weekly": "weekly",
        "lm_regional": regions,
        "lm_all_regions": "daily",
        "lm_zones": StaticPartitions(["eu-north", "eu-west", "us-east"]),
        "lm_areas": StaticPartitions(["eu", "us"]),
    }.items():
        dataset(name, location=f"table:mapped.{name}", partitioning=partitioning)
    day, week, zone = Param("day", "date", required=True), Param("week", "str", required=True), Param("zone", "str")
    for name, params, upstream, produced in (
        ("lm_last7_job", [day], {"lm_days": ("day", TimeWindow(last=7))}, {"lm_trailing": "day"}),
        ("lm_weekly_job", [week], {"lm_days": ("week", TimeWindow(to="weekly"))}, {"lm_weekly": "week"}),
        ("lm_plain_job", [day], {"lm_days": "day"}, {"lm_plain": "day"}),
        ("lm_fanin_job", [day], {"lm_regional": ("day", AllOf("region"))}, {"lm_all_regions": "day"}),
        ("lm_area_job", [zone], {"lm_zones": ("zone", StaticMap(ZONES))}, {"lm_areas": "zone"}),
    ):
        read = upstream if name == "lm_plain_job" else None  # a trigger upstream read through identity: consumed
        spark_job(name, params=params, on_update=upstream, consumes=read, produces=produced)(_no_op)
    sync_datasets()
    yield
    for name in set(_jobs.entries()) - jobs_before:
        _jobs.unregister(name)
    for name in set(_code.entries()) - datasets_before:
        _code.unregister(name)


ZONES = {"eu-north": "eu", "eu-west": "eu", "us-east": "us"}


def _no_op(spark, params):
    return {}


def edge_labels(page: str) -> dict[tuple[str, str], str]:
    """{(from, to): label} of the drawn lineage's edges, by node name ("" for an edge without a label)."""
    drawing = re.search(r'<div class="ds-graph" id="ds-lineage">(.*?)</div>', page, re.S).group(1)
    names = {
        node_id: html.unescape(name)
        for node_id, name in re.findall(
            r'class="node[^"]*">\s*<title>(\w+)</title>.*?<text[^>]*>([^<]+)</text>', drawing, re.S
        )
    }
    found = {}
    for body in re.findall(r'<g id="edge\d+" class="edge">(.*?)</g>', drawing, re.S):
        up, down = html.unescape(re.search(r"<title>(.*?)</title>", body).group(1)).split("->")
        label = re.search(r"<text[^>]*>([^<]+)</text>", body)
        found[(names[up], names[down])] = html.unescape(label.group(1)) if label else ""
    return found


def test_the_lineage_labels_each_edge_read_through_a_mapping_with_the_mapping(mapped_jobs, ds_client):
    client = ds_client()

    days = edge_labels(client.get(url("change", "lm_days")).content.decode())
    assert days[("lm_days", "lm_last7_job")] == "window last 7"
    assert days[("lm_days", "lm_weekly_job")] == "window to weekly"
    assert days[("lm_days", "lm_plain_job")] == ""  # identity: no label
    assert days[("lm_last7_job", "lm_trailing")] == ""  # a job's output: no label
    regional = edge_labels(client.get(url("change", "lm_regional")).content.decode())
    assert regional[("lm_regional", "lm_fanin_job")] == "all of region"
    zones = edge_labels(client.get(url("change", "lm_zones")).content.decode())
    assert zones[("lm_zones", "lm_area_job")] == "map (3 keys)"
    # Seen from the consumer's side (the walk upstream) and on the full lineage page, the same labels.
    weekly = edge_labels(client.get(url("change", "lm_weekly")).content.decode())
    assert weekly[("lm_days", "lm_weekly_job")] == "window to weekly"
    whole = client.get(url("lineage", "lm_all_regions")).content.decode()
    assert edge_labels(whole)[("lm_regional", "lm_fanin_job")] == "all of region"
