"""Partition keys and ranges (queue_app/datasets/partitions.py) and freshness states at their boundaries
(freshness.py): plain values, no database."""

import datetime as dt
import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_app.datasets.freshness import Freshness, freshness_of, freshness_state
from queue_app.datasets.partitions import (
    DAILY,
    HOURLY,
    MAX_RANGE,
    NONE,
    PartitionError,
    StaticPartitions,
    partitioning_of,
)

UTC = dt.UTC
relaxed = settings(deadline=None)  # a loaded machine: no per-example time limit
days = st.dates(min_value=dt.date(1, 1, 1), max_value=dt.date(9999, 12, 31))
moments = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))


def test_canonical_keys_of_dates_datetimes_and_strings():
    assert DAILY.key(dt.date(2026, 11, 26)) == "2026-11-26"
    assert DAILY.key("2026-11-26") == "2026-11-26"
    assert DAILY.key(dt.datetime(2026, 11, 26, 23, 59)) == "2026-11-26"
    # An aware datetime names the partition that holds it in UTC.
    east = dt.timezone(dt.timedelta(hours=9))
    assert DAILY.key(dt.datetime(2026, 11, 27, 5, 0, tzinfo=east)) == "2026-11-26"
    assert HOURLY.key(dt.datetime(2026, 11, 26, 5, 59, 59, tzinfo=UTC)) == "2026-11-26T05"
    assert HOURLY.key(dt.date(2026, 11, 26)) == "2026-11-26T00"
    assert HOURLY.key("2026-11-26T05") == "2026-11-26T05"
    assert HOURLY.key("2026-11-26T07:00:00+02:00") == "2026-11-26T05"
    assert DAILY.key(dt.date(999, 1, 2)) == "0999-01-02"  # zero-padded: keys sort as text in time order
    assert StaticPartitions(["eu", "us"]).key("eu") == "eu"
    assert NONE.key(None) == NONE.key("") == ""


@pytest.mark.parametrize(
    "partitioning, value, message",
    [
        (DAILY, "2026-02-30", "no such date or hour"),
        (DAILY, "2026-11-26T05", "is not a daily partition key like 2026-11-26"),
        (DAILY, "26/11/2026", "is not a daily partition key"),
        (DAILY, "../../etc", "is not a daily partition key"),
        (DAILY, 20261126, "a daily partition is a date, a datetime or a key"),
        (DAILY, None, "a daily partition is a date"),
        (HOURLY, "2026-11-26T05:30", "is not on the hour"),
        (HOURLY, "2026-11-26", "is not an hourly partition key like 2026-11-26T05"),
        (HOURLY, "2026-11-26T24", "no such date"),
        (StaticPartitions(["eu", "us"]), "asia", "is not one of the static partitions: eu, us"),
        (StaticPartitions(["eu", "us"]), "../../etc", "is not one of the static partitions"),
        (NONE, "2026-11-26", "the dataset is not partitioned"),
    ],
)
def test_a_value_that_does_not_fit_is_refused_with_the_reason(partitioning, value, message):
    with pytest.raises(PartitionError, match=re.escape(message)):
        partitioning.key(value)


def test_ranges_include_both_ends_and_refuse_reversed_or_huge_ones():
    assert DAILY.keys("2026-02-27", dt.date(2026, 3, 1)) == ["2026-02-27", "2026-02-28", "2026-03-01"]
    assert HOURLY.keys("2026-11-26T22", "2026-11-27T01") == [
        "2026-11-26T22",
        "2026-11-26T23",
        "2026-11-27T00",
        "2026-11-27T01",
    ]
    assert StaticPartitions(["us", "eu", "apac"]).keys("apac", "eu") == ["apac", "eu"]
    with pytest.raises(PartitionError, match=r"the range ends \(2026-11-01\) before it starts \(2026-11-02\)"):
        DAILY.keys("2026-11-02", "2026-11-01")
    with pytest.raises(PartitionError, match=f"at most {MAX_RANGE}"):
        HOURLY.keys("2000-01-01T00", "2026-01-01T00")
    with pytest.raises(PartitionError, match="not partitioned"):
        NONE.keys("a", "b")


@relaxed
@given(days)
def test_a_daily_key_round_trips_through_its_date(day):
    key = DAILY.key(day)
    assert DAILY.key(DAILY.parse(key)) == key == DAILY.key(key)
    assert DAILY.parse(key).date() == day


@relaxed
@given(moments, offsets)
def test_an_hourly_key_round_trips_and_holds_its_moment(moment, offset):
    aware = moment.replace(tzinfo=offset)
    key = HOURLY.key(aware)
    start = HOURLY.parse(key)
    assert HOURLY.key(start) == key == HOURLY.key(key)
    assert start <= aware < start + dt.timedelta(hours=1)


@relaxed
@given(days, st.integers(min_value=0, max_value=2000))
def test_a_daily_range_is_sorted_unique_and_complete(first, length):
    last = min(first + dt.timedelta(days=length), dt.date(9999, 12, 31))
    keys = DAILY.keys(first, last)
    assert keys == sorted(set(keys))
    assert len(keys) == (last - first).days + 1
    assert keys[0] == DAILY.key(first) and keys[-1] == DAILY.key(last)


@relaxed
@given(moments, st.integers(min_value=0, max_value=500))
def test_an_hourly_range_is_sorted_unique_and_complete(start, hours):
    end = start + dt.timedelta(hours=hours)
    keys = HOURLY.keys(start, end)
    assert keys == sorted(set(keys))
    assert keys[0] == HOURLY.key(start) and keys[-1] == HOURLY.key(end)
    assert len(keys) == (HOURLY.parse(keys[-1]) - HOURLY.parse(keys[0])) // dt.timedelta(hours=1) + 1


@relaxed
@given(st.lists(st.from_regex(r"[a-z0-9][a-z0-9_.=-]{0,10}", fullmatch=True), min_size=1, max_size=8, unique=True))
def test_static_keys_are_themselves_and_their_ranges_sorted(keys):
    static = StaticPartitions(keys)
    assert static.problems() == []
    assert [static.key(k) for k in keys] == keys
    ordered = sorted(keys)
    assert static.keys(ordered[0], ordered[-1]) == ordered


def test_bad_static_keys_are_problems_not_partitions():
    static = StaticPartitions(["eu", "../etc", "", "a/b", 7, "eu"])
    problems = static.problems()
    assert [p for p in problems if "'../etc'" in p and "is not 1-100 letters" in p]
    assert any("''" in p for p in problems) and any("'a/b'" in p for p in problems) and any("7" in p for p in problems)
    assert "a static partition key is declared twice" in problems
    assert StaticPartitions([]).problems() == ["a static partitioning needs at least one key"]
    with pytest.raises(PartitionError):
        static.key("../etc")


def test_partitionings_are_named_in_declarations():
    assert partitioning_of(None) is NONE and partitioning_of("daily") is DAILY and partitioning_of("hourly") is HOURLY
    assert partitioning_of({"static": ["a", "b"]}) == StaticPartitions(["a", "b"]) == partitioning_of(["a", "b"])
    assert StaticPartitions(["a"]) != StaticPartitions(["b"]) and DAILY != HOURLY
    with pytest.raises(PartitionError, match="use None, 'daily', 'hourly', 'weekly', StaticPartitions"):
        partitioning_of("monthly")


def materialized(partition, at):
    return SimpleNamespace(partition=partition, at=at)


def ds(freshness, partitioning=DAILY):
    return SimpleNamespace(freshness=freshness, partitioning=partitioning)


def test_max_age_is_fresh_up_to_and_including_its_limit():
    now = dt.datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    policy = ds(Freshness(max_age=dt.timedelta(hours=26)), NONE)
    limit = now - dt.timedelta(hours=26)
    assert freshness_state(policy, [materialized("", limit)], now) == "fresh"
    assert freshness_state(policy, [materialized("", limit - dt.timedelta(microseconds=1))], now) == "stale"
    # The newest of several decides.
    old, new = materialized("", limit - dt.timedelta(days=3)), materialized("", limit + dt.timedelta(hours=1))
    assert freshness_state(policy, [old, new], now) == "fresh"
    assert freshness_state(policy, [], now) == "missing"


def test_partition_by_makes_yesterday_due_at_its_time_of_day():
    policy = ds(Freshness(partition_by="06:00"))
    yesterday = [materialized("2026-11-26", dt.datetime(2026, 11, 27, 3, tzinfo=UTC))]
    day_before = [materialized("2026-11-25", dt.datetime(2026, 11, 26, 3, tzinfo=UTC))]
    just_before = dt.datetime(2026, 11, 27, 5, 59, 59, 999999, tzinfo=UTC)
    at_six = dt.datetime(2026, 11, 27, 6, 0, tzinfo=UTC)
    assert freshness_state(policy, day_before, just_before) == "fresh"  # 2026-11-26 is not due yet
    assert freshness_state(policy, day_before, at_six) == "stale"
    assert freshness_state(policy, yesterday, at_six) == "fresh"
    assert freshness_state(policy, day_before + yesterday, at_six) == "fresh"
    # Another time zone's clock reads the same moment.
    tokyo = at_six.astimezone(dt.timezone(dt.timedelta(hours=9)))
    assert freshness_state(policy, day_before, tokyo) == "stale"
    assert freshness_state(policy, [], at_six) == "missing"


def test_no_policy_or_a_bad_one_is_unknown_and_a_bad_one_says_why():
    now = dt.datetime(2026, 11, 27, tzinfo=UTC)
    rows = [materialized("2026-11-26", now)]
    assert freshness_state(ds(None), rows, now) == "unknown"
    assert freshness_state(ds(Freshness(partition_by="25:00")), rows, now) == "unknown"
    assert Freshness().problems(DAILY) == ["a freshness policy sets exactly one of max_age or partition_by"]
    assert Freshness(max_age=dt.timedelta(hours=1), partition_by="06:00").problems(DAILY)
    assert "positive duration" in Freshness(max_age=dt.timedelta(0)).problems(DAILY)[0]
    assert "positive duration" in Freshness(max_age=26).problems(DAILY)[0]
    assert "like '06:00'" in Freshness(partition_by="6am").problems(DAILY)[0]
    assert "daily partitioned dataset only" in Freshness(partition_by="06:00").problems(HOURLY)[0]
    assert Freshness(partition_by="23:59").problems(DAILY) == []


def test_settings_name_freshness_in_json():
    assert freshness_of({"max_age_hours": 26}) == Freshness(max_age=dt.timedelta(hours=26))
    assert freshness_of({"max_age_seconds": 60}) == Freshness(max_age=dt.timedelta(seconds=60))
    assert freshness_of({"partition_by": "06:00"}) == Freshness(partition_by="06:00")
    for bad in ({"max_age_hours": "26"}, {"max_age_days": 1}, {"max_age_hours": True}, "26h"):
        with pytest.raises(ValueError, match="use Freshness"):
            freshness_of(bad)
