"""Partitions with several dimensions (partitions.MultiPartitions), the weekly grain, dynamic partition sets
(datasets/dynamic.py) and mappings between datasets (datasets/mappings.py) deciding data-aware triggers in process.
The mapped triggers under real workers: tests/datasets/processes/test_datasets_triggers_workers.py."""

import threading

import pytest
from django.db import connections, transaction

from queue_app.datasets import DatasetError, DynamicPartitions, MultiPartitions, StaticPartitions, dataset, dynamic
from queue_app.datasets.declarations import _code, build
from queue_app.datasets.mappings import AllOf, StaticMap, TimeWindow, mapping_of
from queue_app.datasets.models import DynamicPartitionKey, Materialization, TriggerFire
from queue_app.datasets.partitions import DAILY, WEEKLY, PartitionError, partitioning_of
from queue_app.datasets.refs import DatasetRef
from queue_app.datasets.services import record_materialization
from queue_app.datasets.triggers import Consumer, OnUpdate, trigger_problems
from queue_app.models import QueueItem
from tests.support.waiting import seen_waiting
from tests.tasks import trigger_tasks

REGIONS = MultiPartitions(day="daily", region=StaticPartitions(["eu", "us"]))


def test_a_multi_dimension_key_is_canonical_ordered_and_a_bad_one_names_its_dimension():
    assert REGIONS.key("2026-11-30|eu") == REGIONS.key({"region": "eu", "day": "2026-11-30"}) == "2026-11-30|eu"
    assert REGIONS.key(("2026-11-30", "us")) == "2026-11-30|us" and REGIONS.parts("2026-11-30|us")["region"] == "us"
    with pytest.raises(PartitionError, match="dimension 'region': 'asia' is not one of the static partitions"):
        REGIONS.key("2026-11-30|asia")
    with pytest.raises(PartitionError, match="dimension 'day': '2026-11-31' is not a daily partition key"):
        REGIONS.key("2026-11-31|eu")
    with pytest.raises(PartitionError, match=r"one per dimension \(day\|region\), like 2026-11-26\|eu"):
        REGIONS.key("2026-11-30")
    assert REGIONS.keys("2026-11-29|*", "2026-11-30|*") == [
        "2026-11-29|eu",
        "2026-11-29|us",
        "2026-11-30|eu",
        "2026-11-30|us",
    ]
    assert REGIONS.keys("2026-11-29|us", "2026-11-30|us") == ["2026-11-29|us", "2026-11-30|us"]
    with pytest.raises(PartitionError, match="dimension 'region': a range runs over the time dimension only"):
        REGIONS.keys("2026-11-29|eu", "2026-11-30|us")
    assert partitioning_of(REGIONS.describe()) == REGIONS  # the JSON form (a list: jsonb keeps no key order)
    assert partitioning_of({"dimensions": {"day": "daily", "region": {"static": ["eu", "us"]}}}) == REGIONS
    for bad, why in (
        ({"day": "daily"}, "at least two dimensions"),
        ({"day": "daily", "hour": "hourly"}, "at most one dimension is by time"),
        ({"Day": "daily", "r": ["eu"]}, "a name is 1-50 lower-case"),
    ):
        with pytest.raises(PartitionError, match=why):
            MultiPartitions(bad)
    with pytest.raises(DatasetError, match="dataset 'x': a multi-dimension partitioning needs at least two"):
        build("x", location="table:t.x", partitioning={"dimensions": {"day": "daily"}})


def test_weekly_keys_are_iso_weeks_that_sort_in_time_order():
    assert WEEKLY.key("2026-11-30") == WEEKLY.key("2026-12-06") == "2026-W49"
    assert WEEKLY.key("2027-01-01") == "2026-W53" and WEEKLY.keys("2026-W52", "2027-W01") == [
        "2026-W52",
        "2026-W53",
        "2027-W01",
    ]
    with pytest.raises(PartitionError, match="no such ISO week"):
        WEEKLY.key("2025-W53")


def test_mappings_name_the_partitions_they_read_and_their_problems():
    week = TimeWindow(to="weekly")
    assert week.upstream_keys(DAILY, WEEKLY, "2026-W49") == [
        f"2026-{d}" for d in ("11-30", "12-01", "12-02", "12-03", "12-04", "12-05", "12-06")
    ]
    assert week.downstream_keys(DAILY, WEEKLY, "2026-12-02") == ["2026-W49"]
    last3 = TimeWindow(last=3)
    assert last3.upstream_keys(DAILY, DAILY, "2026-12-02") == ["2026-11-30", "2026-12-01", "2026-12-02"]
    assert last3.downstream_keys(DAILY, DAILY, "2026-12-02") == ["2026-12-02", "2026-12-03", "2026-12-04"]
    fan = AllOf("region")
    assert fan.target(REGIONS) == DAILY and fan.upstream_keys(REGIONS, DAILY, "2026-12-02") == [
        "2026-12-02|eu",
        "2026-12-02|us",
    ]
    weekly_regions = week.target(REGIONS)
    assert week.downstream_keys(REGIONS, weekly_regions, "2026-12-02|us") == ["2026-W49|us"]
    zones = StaticPartitions(["eu-west", "eu-north", "us-east"])
    zmap = StaticMap({"eu-west": "eu", "eu-north": "eu", "us-east": "us"})
    assert zmap.upstream_keys(zones, StaticPartitions(["eu", "us"]), "eu") == ["eu-north", "eu-west"]
    assert zmap.problems(zones, StaticPartitions(["eu"])) == ["a static map: 'us' is not a key of the consumer"]
    assert TimeWindow(to="daily").problems(WEEKLY, DAILY)[0].startswith("a window without last=N reads finer")
    assert fan.problems(DAILY, DAILY) == ["all_of('region'): the upstream has no dimension 'region'"]
    assert mapping_of({"window": {"last": 7}}) == TimeWindow(7) and mapping_of({"all_of": "region"}) == fan
    with pytest.raises(PartitionError, match="last is a whole number"):
        TimeWindow(last=0)


@pytest.fixture
def declared():
    trigger_tasks.declare()
    yield
    trigger_tasks.undeclare()


def fires(task):
    return list(TriggerFire.objects.filter(consumer=f"task:{task}").order_by("id"))


@pytest.mark.django_db(transaction=True)
def test_a_weekly_rollup_fires_once_its_seven_days_are_recorded_and_a_fan_in_once_every_region_is(declared):
    days = [f"2026-12-0{d}" for d in range(1, 8)]  # 2026-W49 is 11-30 .. 12-06: 12-07 is W50's first day
    record_materialization("tt_daily", "2026-11-30")
    for day in days[:5]:
        record_materialization("tt_daily", day)
    assert fires("tests.trig_weekly") == []
    record_materialization("tt_daily", "2026-12-06")  # the last day of W49, in this transaction
    (fire,) = fires("tests.trig_weekly")
    assert fire.partition == "2026-W49" and len(fire.upstream) == 7 and "tt_daily[2026-11-30]" in fire.upstream
    item = QueueItem.objects.get(task="tests.trig_weekly")
    assert item.payload["partition"] == "2026-W49" and item.payload["upstream"] == fire.upstream
    record_materialization("tt_daily", "2026-12-01")  # all: one newer day is not a new set of seven
    record_materialization("tt_daily", "2026-12-07")
    assert len(fires("tests.trig_weekly")) == 1

    record_materialization("tt_region", "2026-12-02|eu")
    record_materialization("tt_region", {"day": "2026-12-02", "region": "us"})
    assert fires("tests.trig_regions") == []
    record_materialization("tt_region", "2026-12-02|apac")
    (fan,) = fires("tests.trig_regions")
    assert fan.partition == "2026-12-02" and sorted(fan.upstream) == [
        "tt_region[2026-12-02|apac]",
        "tt_region[2026-12-02|eu]",
        "tt_region[2026-12-02|us]",
    ]
    with pytest.raises(DatasetError, match="dimension 'region': 'asia' is not one of"):
        record_materialization("tt_region", "2026-12-02|asia")
    assert not Materialization.objects.filter(partition__endswith="asia").exists()


@pytest.mark.django_db(transaction=True)
def test_the_last_two_days_of_a_week_recorded_in_overlapping_transactions_fire_the_rollup_once(declared):
    """The first recorder of day 6 holds its transaction (and the week's state row) open; the recorder of day 7
    waits on that row lock, then reads the first's pending day and fires: one fire, by whichever commits last."""
    for day in ("2026-11-30", "2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"):
        record_materialization("tt_daily", day)
    first_recorded, release = threading.Event(), threading.Event()

    def first():
        try:
            with transaction.atomic():
                record_materialization("tt_daily", "2026-12-05")
                first_recorded.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_recorded.wait(10)
    second = threading.Thread(
        target=lambda: (record_materialization("tt_daily", "2026-12-06"), connections.close_all())
    )
    second.start()
    seen_waiting(what="the day 7 recorder waiting on the week's state row", timeout=10)
    assert fires("tests.trig_weekly") == []
    release.set()
    thread.join(10)
    second.join(10)
    (fire,) = fires("tests.trig_weekly")
    assert len(fire.upstream) == 7


@pytest.mark.django_db(transaction=True)
def test_mapped_upstreams_are_checked_against_the_consumer():
    dataset("dim_days", location="table:t.dim_days", partitioning="daily")
    dataset("dim_weeks", location="table:t.dim_weeks", partitioning="weekly")
    try:

        def consumer(key, ref, produces=()):
            return Consumer(key, OnUpdate((ref,)), lambda p, u: [], produces=produces)

        problems = trigger_problems(
            {
                "task:ok": consumer("task:ok", DatasetRef("dim_days", None, TimeWindow(to="weekly"))),
                "task:bad": consumer("task:bad", DatasetRef("dim_weeks", None, TimeWindow(to="daily"))),
                "task:map": consumer("task:map", DatasetRef("dim_days", None, StaticMap({"a": "b"}))),
                # Kept as declared (the core's vocabulary, queue_app/dataset_refs.py); parsed here, JSON or not
                "task:json": consumer("task:json", DatasetRef("dim_days", None, {"window": {"to": "weekly"}})),
                "task:junk": consumer("task:junk", DatasetRef("dim_days", None, {"bogus": 1})),
            }
        )
        messages = [m for _id, m in problems]
        assert not any(m.startswith(("task:ok", "task:json")) for m in messages)
        assert ("jobsite.E108", "task:junk on_update: 'dim_days': mapping \"{'bogus': 1}\": use TimeWindow(...)") in [
            (i, m.split(", AllOf")[0]) for i, m in problems
        ]
        assert any(m.startswith("task:bad") and "reads finer partitions" in m for m in messages)
        assert any(m.startswith("task:map") and "nothing says how the consumer is partitioned" in m for m in messages)
    finally:
        _code.unregister("dim_days")
        _code.unregister("dim_weeks")


@pytest.mark.django_db(transaction=True)
def test_dynamic_keys_are_added_removed_with_history_and_refuse_removal_while_a_run_is_open():
    dataset("dyn_customers", location="table:t.dyn", partitioning=DynamicPartitions("customers"))
    dataset(
        "dyn_sales",
        location="table:t.dyn_sales",
        partitioning=MultiPartitions(day="daily", customer=DynamicPartitions("customers")),
    )
    try:
        with pytest.raises(DatasetError, match="is not a partition of the dynamic set 'customers'"):
            record_materialization("dyn_customers", "acme")
        assert dynamic.add_keys("customers", ["acme", "globex"], by="test") == ["acme", "globex"]
        assert dynamic.add_keys("customers", ["acme"]) == []  # already there
        with pytest.raises(DatasetError, match="not a dynamic partition key"):
            dynamic.add_keys("customers", ["ok", "../etc"])
        assert [k["key"] for k in dynamic.list_keys("customers")] == ["acme", "globex"]  # "ok" not added either
        record_materialization("dyn_customers", "acme")
        record_materialization("dyn_sales", "2026-12-01|globex")
        assert dynamic.set_of("dyn_sales") == "customers"

        def open_runs(name, keys):
            return ["spark_run:7"] if "acme" in keys else []

        dynamic.add_open_runs(open_runs)
        try:
            with pytest.raises(DatasetError, match=r"a run of these keys is open \(spark_run:7\)"):
                dynamic.remove_keys("customers", ["globex", "acme"])
        finally:
            dynamic._open_runs.remove(open_runs)
        assert dynamic.remove_keys("customers", ["globex"], by="test") == ["globex"]
        with pytest.raises(DatasetError, match="not in the dynamic set 'customers': globex"):
            dynamic.remove_keys("customers", ["globex"])
        with pytest.raises(DatasetError, match="dimension 'customer': 'globex' is not a partition"):
            record_materialization("dyn_sales", "2026-12-02|globex")
        assert Materialization.objects.filter(dataset="dyn_sales", partition="2026-12-01|globex").exists()
        history = dynamic.list_keys("customers", history=True)
        assert [(k["key"], k["removed_by"]) for k in history] == [("acme", ""), ("globex", "test")]
        dynamic.add_keys("customers", ["globex"])
        assert DynamicPartitionKey.objects.filter(partition_set="customers", key="globex").count() == 2
    finally:
        _code.unregister("dyn_customers")
        _code.unregister("dyn_sales")
