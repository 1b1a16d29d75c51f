"""Datasets in process against the real database: declarations (code and settings), the system checks
jobsite.E101-E105, record_materialization and observe (validated, written in the caller's transaction), the sync
of declarations to rows, and hostile input (long names, partitions like ../../etc, paths escaping the root)."""

import datetime as dt
import os

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, transaction

from queue_app.datasets import DatasetError, Freshness, StaticPartitions, dataset, declared_datasets, get_dataset
from queue_app.datasets.checks import dataset_declarations
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Dataset as DatasetRow
from queue_app.datasets.models import Materialization
from queue_app.datasets.services import observe, record_materialization, schema_fingerprint
from queue_app.datasets.status import NEWEST, newest, partition_counts
from queue_app.datasets.sync import sync_datasets


class Boom(Exception):
    pass


@pytest.fixture
def root(tmp_path, monkeypatch):
    """The one allowed dataset root, and no datasets but the ones a test declares."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv(ROOTS_ENV, str(data))
    declared_before = set(_code.entries())
    yield data
    for name in set(_code.entries()) - declared_before:
        _code.unregister(name)


def ids(messages):
    return sorted(m.id for m in messages)


def write(path, text="x" * 10):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_code_and_settings_declare_datasets_and_settings_win_a_shared_name(root, settings):
    dataset("ds_events", location="events/day={partition}", partitioning="daily", owner="eng")
    dataset("ds_rollup", location="rollup")
    settings.JOBSITE = {
        "DATASETS": {
            "ds_rollup": {"location": "moved/rollup", "freshness": {"max_age_hours": 26}},
            "ds_regions": {"location": "regions/{partition}", "partitioning": {"static": ["eu", "us"]}},
        }
    }
    known = declared_datasets()
    assert known["ds_events"].declared_in == "code" and known["ds_events"].owner == "eng"
    assert known["ds_rollup"].declared_in == "settings" and known["ds_rollup"].location.text == "moved/rollup"
    assert known["ds_rollup"].freshness == Freshness(max_age=dt.timedelta(hours=26))
    assert known["ds_regions"].partitioning == StaticPartitions(["eu", "us"])
    assert dataset_declarations() == []  # a good declaration set is silent
    with pytest.raises(DatasetError, match=r"unknown dataset 'ds_event' \(did you mean 'ds_events'"):
        get_dataset("ds_event")


def test_the_checks_fire_on_each_bad_declaration(root, settings, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    dataset("ds_twice", location="twice/{partition}", partitioning="daily")
    dataset("ds_dotdot", location="../elsewhere/x")
    dataset("ds_symlink", location="link/x")
    dataset("ds_absolute", location=str(outside / "x"))
    dataset("ds_fresh", location="f", partitioning="hourly", freshness=Freshness(partition_by="06:00"))
    dataset("ds_fresh2", location="f2", freshness=Freshness(max_age=dt.timedelta(hours=-1)))
    dataset("ds_static", location="s/{partition}", partitioning=StaticPartitions(["eu", "../etc"]))
    settings.JOBSITE = {
        "DATASETS": {
            "ds_twice": {"location": "twice/{partition}", "partitioning": "hourly"},
            "ds_nolocation": {"partitioning": "daily"},
            "ds_typo": {"location": "t", "partition": "daily"},
            "bad name!": {"location": "t"},
        }
    }
    found = dataset_declarations()
    by_id = {}
    for message in found:
        by_id.setdefault(message.id, []).append(message.msg)
    assert (
        ids(found)
        == ["jobsite.E101"] + ["jobsite.E102"] * 3 + ["jobsite.E103"] * 2 + ["jobsite.E104"] + ["jobsite.E105"] * 3
    )
    [twice] = by_id["jobsite.E101"]
    assert "'ds_twice' is declared twice with different partitionings: 'daily' in code" in twice
    assert "'hourly' in settings (DATASETS['ds_twice'])" in twice
    assert all("is outside the allowed dataset roots" in m for m in by_id["jobsite.E102"])
    assert {m.split("'")[1] for m in by_id["jobsite.E102"]} == {"ds_dotdot", "ds_symlink", "ds_absolute"}
    assert any("daily partitioned dataset only" in m for m in by_id["jobsite.E103"])
    assert any("positive duration" in m for m in by_id["jobsite.E103"])
    assert "static partition key '../etc' is not 1-100 letters" in by_id["jobsite.E104"][0]
    e105 = " ".join(by_id["jobsite.E105"])
    assert "DATASETS['ds_typo'] is left out: unknown keys partition" in e105
    assert "a dataset needs a location" in e105 and "a dataset's name is 1-200 letters" in e105
    # Registered with Django: `manage.py check` fails on them.
    with pytest.raises(SystemCheckError, match="jobsite.E101"):
        call_command("check")


def test_declarations_refuse_bad_names_locations_and_partitionings(root):
    for name in ("x" * 201, "", "../etc", "a b", "-x", None):
        with pytest.raises(DatasetError, match="a dataset's name is 1-200 letters"):
            dataset(name, location="x")
    dataset("y" * 200, location="x")  # the longest name is fine
    bad = {
        "table:public": "is not table:schema.name",
        "table:a.b;drop table x": "is not table:schema.name",
        "x/{partition}/{partition}": "the only placeholder is {partition}, at most once",
        "x/{day}": "the only placeholder is {partition}",
        "x\0y": "without NUL bytes",
        "": "a dataset needs a location",
    }
    for location, message in bad.items():
        with pytest.raises(DatasetError, match=message.replace("{", r"\{").replace("}", r"\}")):
            dataset("ds_bad", location=location)
    with pytest.raises(DatasetError, match="partitioning 'monthly'"):
        dataset("ds_bad", location="x", partitioning="monthly")
    with pytest.raises(DatasetError, match="unknown dataset 'zzzzzzzzzz"):
        get_dataset("z" * 10_000)
    assert "ds_bad" not in declared_datasets()


@pytest.mark.django_db
def test_record_validates_canonicalises_and_keeps_every_figure(root):
    dataset("ds_daily", location="d/{partition}", partitioning="daily")
    schema = {"type": "struct", "fields": [{"name": "n", "type": "long"}]}
    recorded = record_materialization(
        "ds_daily",
        dt.datetime(2026, 11, 27, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=3))),
        rows=1200,
        bytes=4096,
        files=2,
        schema=schema,
        metadata={"preview": [1, 2]},
        spark_run_id=7,
        workflow_step_id=9,
    )
    row = Materialization.objects.get(id=recorded.id)
    assert [getattr(recorded, f.attname) for f in Materialization._meta.concrete_fields] == [
        getattr(row, f.attname) for f in Materialization._meta.concrete_fields
    ]  # what record returns is the row as written
    assert (row.dataset, row.partition, row.rows, row.bytes, row.files) == ("ds_daily", "2026-11-26", 1200, 4096, 2)
    assert (row.source, row.spark_run_id, row.workflow_step_id, row.item_id) == ("spark_run", 7, 9, None)
    assert row.schema_fingerprint == schema_fingerprint(dict(reversed(list(schema.items())))) != ""
    assert row.metadata == {"preview": [1, 2]} and row.at is not None
    assert DatasetRow.objects.get(name="ds_daily").config["partitioning"] == "daily"
    assert record_materialization("ds_daily", "2026-11-25").source == "code"

    bad = [
        ({"partition": "2026-11-26T05"}, "dataset 'ds_daily': '2026-11-26T05' is not a daily partition key"),
        ({"partition": "../../etc"}, "is not a daily partition key"),
        ({"partition": "2026-11-26", "rows": -1}, "rows must be a whole number from 0"),
        ({"partition": "2026-11-26", "bytes": 1.5}, "bytes must be a whole number"),
        ({"partition": "2026-11-26", "files": True}, "files must be a whole number"),
        ({"partition": "2026-11-26", "metadata": {"x": object()}}, "metadata must be JSON data"),
        ({"partition": "2026-11-26", "metadata": {"x": "y" * 70_000}}, "metadata is 7"),
        ({"partition": "2026-11-26", "schema": {1, 2}}, "schema must be JSON data"),
        ({"partition": "2026-11-26", "spark_run_id": "7"}, "spark_run_id must be a positive id"),
    ]
    before = Materialization.objects.count()
    for kwargs, message in bad:
        partition = kwargs.pop("partition")
        with pytest.raises(DatasetError, match=message.replace("(", r"\(")):
            record_materialization("ds_daily", partition, **kwargs)
    with pytest.raises(DatasetError, match="unknown dataset 'ds_dayly'"):
        record_materialization("ds_dayly", "2026-11-26")
    assert Materialization.objects.count() == before


@pytest.mark.django_db
def test_a_record_or_an_observation_in_a_transaction_that_rolls_back_leaves_nothing(root):
    dataset("ds_rollback", location="r/{partition}", partitioning="daily")
    write(root / "r" / "2026-11-26" / "part-0")
    with pytest.raises(Boom), transaction.atomic():
        recorded = record_materialization("ds_rollback", "2026-11-26", rows=5, item_id=3)
        observed = observe("ds_rollback", "2026-11-26")
        # Written in the caller's transaction: visible to it before the rollback.
        assert Materialization.objects.filter(id__in=[recorded.id, observed.id]).count() == 2
        assert DatasetRow.objects.filter(name="ds_rollback").exists()
        raise Boom
    assert not Materialization.objects.filter(dataset="ds_rollback").exists()
    assert not DatasetRow.objects.filter(name="ds_rollback").exists()


@pytest.mark.django_db
def test_observe_counts_and_sizes_the_partition_files_and_nothing_outside(root, tmp_path):
    dataset("ds_files", location="files/day={partition}", partitioning="daily")
    dataset("ds_table", location="table:analytics.clicks", partitioning=StaticPartitions(["eu"]))
    day = root / "files" / "day=2026-11-26"
    write(day / "part-0.parquet", "a" * 100)
    write(day / "nested" / "part-1.parquet", "b" * 50)
    secret = tmp_path / "secret"
    secret.write_text("s" * 1000)
    os.symlink(secret, day / "leak")  # a file link leading outside the roots: not counted
    os.symlink(tmp_path, day / "dirlink")  # a directory link: not followed
    seen = observe("ds_files", dt.date(2026, 11, 26), metadata={"by": "test"})
    assert (seen.partition, seen.files, seen.bytes, seen.source) == ("2026-11-26", 2, 150, "observed")
    assert seen.metadata == {"by": "test"}
    table = observe("ds_table", "eu")
    assert (table.partition, table.files, table.bytes, table.source) == ("eu", None, None, "observed")

    (root / "files" / "day=2026-11-25").mkdir()
    with pytest.raises(DatasetError, match="no files under .*day=2026-11-25; nothing recorded"):
        observe("ds_files", "2026-11-25")
    with pytest.raises(DatasetError, match="nothing at .*day=2026-11-24; nothing recorded"):
        observe("ds_files", "2026-11-24")
    with pytest.raises(DatasetError, match="is not a daily partition key"):
        observe("ds_files", "../../etc")
    assert Materialization.objects.filter(dataset="ds_files").count() == 1


@pytest.mark.django_db
def test_observe_refuses_a_location_that_a_symlink_leads_outside_the_root(root, tmp_path):
    outside = tmp_path / "outside"
    write(outside / "day=2026-11-26" / "part-0", "o" * 10)
    (root / "moved").symlink_to(outside)
    dataset("ds_escape", location="moved/day={partition}", partitioning="daily")
    dataset("ds_dotdot", location="../outside/day={partition}", partitioning="daily")
    for name in ("ds_escape", "ds_dotdot"):
        with pytest.raises(DatasetError, match="is outside the allowed dataset roots.*nothing recorded"):
            observe(name, "2026-11-26")
    assert not Materialization.objects.filter(dataset__in=["ds_escape", "ds_dotdot"]).exists()


@pytest.mark.django_db
def test_sync_writes_changed_declarations_only_and_keeps_undeclared_rows(root, settings):
    dataset("ds_sync", location="a", owner="one")
    settings.JOBSITE = {"DATASETS": {"ds_sync_settings": {"location": "b", "partitioning": "hourly"}}}
    DatasetRow.objects.create(name="ds_gone", config={}, declared_in="code")
    assert sync_datasets() >= 2
    assert sync_datasets() == 0  # nothing changed: nothing rewritten
    assert DatasetRow.objects.get(name="ds_sync").config["owner"] == "one"
    assert DatasetRow.objects.get(name="ds_sync_settings").declared_in == "settings"
    settings.JOBSITE = {"DATASETS": {"ds_sync": {"location": "a", "owner": "two"}}}
    assert sync_datasets() == 1
    row = DatasetRow.objects.get(name="ds_sync")
    assert (row.declared_in, row.config["owner"]) == ("settings", "two")
    assert DatasetRow.objects.filter(name="ds_gone").exists()


@pytest.mark.django_db
def test_latest_per_partition_and_a_partition_range_are_index_scans(root):
    dataset("ds_plan", location="p/{partition}", partitioning="daily")
    for day in range(1, 29):
        record_materialization("ds_plan", f"2026-02-{day:02d}", rows=day)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_app_materialization")
        cursor.execute("SET LOCAL enable_seqscan = off")
        # Nor a bitmap scan and a sort: with other tests' dead rows in the table's pages the planner may price
        # those below the ordered index scan for 7 of 28 rows; what is proved is that the index serves the order.
        cursor.execute("SET LOCAL enable_bitmapscan = off")
    latest = Materialization.objects.filter(dataset="ds_plan", partition="2026-02-03").order_by("-at")[:1]
    ranged = Materialization.objects.filter(dataset="ds_plan", partition__range=("2026-02-03", "2026-02-09")).order_by(
        "partition"
    )
    last = Materialization.objects.filter(dataset="ds_plan").order_by("-at", "-id")[:1]
    for query, index in (
        (latest, "materialization_partition"),
        (ranged, "materialization_partition"),
        (last, "materialization_latest"),
    ):
        plan = query.explain()
        assert index in plan and "Sort" not in plan, plan
    assert [m.rows for m in ranged] == list(range(3, 10))
    with connection.cursor() as cursor:  # the list's read: two index probes per dataset, no sort, no scan
        cursor.execute("EXPLAIN " + NEWEST, [["ds_plan", "ds_other"]])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "materialization_partition" in plan and "materialization_latest" in plan, plan
    assert "Sort" not in plan and "Seq Scan on queue_app_materialization" not in plan, plan
    assert [m.partition for m in newest(["ds_plan"])["ds_plan"]] == ["2026-02-28", "2026-02-28"]
    assert newest(["ds_plan", "ds_none"])["ds_none"] == []


@pytest.mark.django_db
def test_partition_counts_read_the_index_or_probe_it_past_a_bound_and_agree(root):
    dataset("ds_many", location="p/{partition}", partitioning="daily")
    dataset("ds_few", location="q/{partition}", partitioning="daily")
    for day in range(1, 6):
        for _ in range(3):  # three materializations of each of five partitions
            record_materialization("ds_many", f"2026-03-{day:02d}")
    record_materialization("ds_few", "2026-03-01")

    names = ["ds_many", "ds_few", "ds_none"]
    scanned = partition_counts(names)  # every dataset within the bound: its index entries counted
    probed = partition_counts(names, scanned=2)  # ds_many past it: one probe per partition

    assert scanned == probed == {"ds_many": 5, "ds_few": 1, "ds_none": 0}
    assert partition_counts(["ds_many"], cap=2, scanned=2) == {"ds_many": 3}  # "2+" past the cap


@pytest.mark.django_db(transaction=True)
def test_migrate_syncs_the_declared_datasets_to_rows(root):
    dataset("ds_migrated", location="m", owner="ops")
    assert not DatasetRow.objects.filter(name="ds_migrated").exists()
    call_command("migrate", verbosity=0)
    row = DatasetRow.objects.get(name="ds_migrated")
    assert (row.declared_in, row.config["owner"], row.config["location"]) == ("code", "ops", "m")
