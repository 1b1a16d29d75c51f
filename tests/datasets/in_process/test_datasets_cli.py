"""`manage.py dataset list|show|observe` as real processes (the `manage` fixture) on the test database: the JSON
shapes issue 38 names, newest first, and exit status 1 with a clear message (and nothing written) for an unknown
dataset, a partition that does not fit, a hostile name or partition, or nothing to observe."""

import datetime as dt
import json

import pytest
from django.utils import timezone

from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.services import record_materialization
from tests.tasks import datasets_declared  # noqa: F401  (declares in this process what the children --import)

pytestmark = pytest.mark.django_db(transaction=True)
IMPORT = ("--import", "tests.tasks.datasets_declared")
LIST_FIELDS = {"name", "partitioning", "last_materialized", "freshness", "checks"}
SHOW_FIELDS = {"name", "location", "partitioning", "producers", "consumers", "freshness", "materializations"}
MATERIALIZATION_FIELDS = {"partition", "at", "rows", "bytes", "files", "run_id", "step_id", "checks"}


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))  # this process and (through child_env) the children
    return tmp_path


@pytest.fixture
def dataset_cli(manage, root):
    def run(*args: str):
        return manage("dataset", *IMPORT, *args)

    return run


def test_list_json_gives_each_dataset_its_partitioning_last_materialization_and_freshness(dataset_cli):
    now = timezone.now()
    record_materialization("events", now, rows=10, spark_run_id=1)  # today's partition: never late
    stale = record_materialization("rollup", rows=3)
    Materialization.objects.filter(id=stale.id).update(at=now - dt.timedelta(hours=27))
    record_materialization("clicks_hourly", now)  # no freshness policy

    done = dataset_cli("list", "--json")

    assert done.returncode == 0, done.stderr
    listed = {row["name"]: row for row in json.loads(done.stdout)}
    assert {"events", "rollup", "regions", "clicks_hourly"} <= set(listed)
    assert all(set(row) == LIST_FIELDS for row in listed.values())
    assert {name: listed[name]["freshness"] for name in ("events", "rollup", "regions", "clicks_hourly")} == {
        "events": "fresh",
        "rollup": "stale",
        "regions": "missing",
        "clicks_hourly": "unknown",
    }
    assert listed["events"]["partitioning"] == "daily" and listed["rollup"]["partitioning"] is None
    assert listed["regions"]["partitioning"] == {"static": ["eu", "us"]}
    assert dt.datetime.fromisoformat(listed["rollup"]["last_materialized"]) < now - dt.timedelta(hours=26)
    assert listed["regions"]["last_materialized"] is None
    assert {row["checks"] for row in listed.values()} == {"none"}


def test_show_json_lists_materializations_newest_first_and_filters_one_partition(dataset_cli):
    first = record_materialization("events", "2026-11-25", rows=1, bytes=10, files=1, spark_run_id=5)
    second = record_materialization("events", "2026-11-26", rows=2, workflow_step_id=8)
    third = record_materialization("events", "2026-11-25", rows=3)
    for age, row in ((3, first), (2, second), (1, third)):
        Materialization.objects.filter(id=row.id).update(at=timezone.now() - dt.timedelta(hours=age))

    done = dataset_cli("show", "events", "--json")

    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert set(shown) == SHOW_FIELDS
    assert (shown["location"], shown["partitioning"], shown["producers"], shown["consumers"]) == (
        "events/day={partition}",
        "daily",
        [],
        [],
    )
    history = shown["materializations"]
    assert all(set(m) == MATERIALIZATION_FIELDS for m in history)
    assert [(m["partition"], m["rows"]) for m in history] == [("2026-11-25", 3), ("2026-11-26", 2), ("2026-11-25", 1)]
    assert (history[2]["run_id"], history[2]["bytes"], history[2]["files"]) == (5, 10, 1)
    assert (history[1]["step_id"], history[1]["run_id"]) == (8, None)

    one = dataset_cli("show", "events", "--partition", "2026-11-25", "--json")
    assert [m["rows"] for m in json.loads(one.stdout)["materializations"]] == [3, 1]
    hourly = dataset_cli("show", "clicks_hourly", "--partition", "2026-11-26T07:00:00+02:00", "--json")
    assert hourly.returncode == 0, hourly.stderr
    assert json.loads(hourly.stdout)["materializations"] == []


def test_observe_records_the_partition_files_and_prints_json(dataset_cli, root):
    day = root / "events" / "day=2026-11-26"
    day.mkdir(parents=True)
    (day / "part-0.parquet").write_bytes(b"p" * 300)
    (day / "part-1.parquet").write_bytes(b"q" * 200)

    done = dataset_cli("observe", "events", "--partition", "2026-11-26", "--json")

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["dataset"], seen["partition"], seen["files"], seen["bytes"]) == ("events", "2026-11-26", 2, 500)
    row = Materialization.objects.get(id=seen["id"])
    assert (row.source, row.files, row.bytes) == ("observed", 2, 500)


@pytest.mark.parametrize(
    "args, message",
    [
        (("show", "evnts"), "unknown dataset 'evnts' (did you mean 'events'"),  # the closest first
        (("show", "x" * 5000), "unknown dataset 'xxxxxxxx"),
        (("observe", "nope", "--partition", "2026-11-26"), "unknown dataset 'nope'"),
        (("show", "events", "--partition", "2026-13-01"), "dataset 'events': '2026-13-01' is not a daily partition"),
        (("observe", "events", "--partition", "../../etc"), "'../../etc' is not a daily partition key"),
        (("observe", "regions", "--partition", "../../etc"), "'../../etc' is not one of the static partitions"),
        (("observe", "rollup", "--partition", "2026-11-26"), "the dataset is not partitioned"),
        (("observe", "events", "--partition", "2026-11-20"), "nothing at"),
        (("observe", "regions", "--partition", "eu"), "nothing at"),
    ],
)
def test_bad_input_exits_1_with_a_clear_message_and_writes_nothing(dataset_cli, args, message):
    done = dataset_cli(*args)

    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not Materialization.objects.exists()
