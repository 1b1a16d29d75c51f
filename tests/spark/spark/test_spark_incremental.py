"""Incremental queue analytics: a watermark per job, advanced in the publish transaction; each run counts what
was settled before its as_of since the last run; each reservation counted exactly once in the table; a re-run
of a run computes the same numbers and moves nothing back. Checked against PostgreSQL computing the same."""

import datetime as dt

import pytest

from queue_app.models import Reservation
from queue_app.spark.models import SparkWatermark
from queue_app.spark.registry import get_job
from tests.support.spark_analytics import SINCE, expected_table, run_and_publish, table, trigger_values
from tests.support.spark_fixtures import seed_queue_history, spark_session  # noqa: F401  (`spark`)

pytestmark = pytest.mark.spark


def test_two_incremental_runs_count_each_reservation_once_and_a_rerun_gives_the_same(spark, transactional_db):
    seed_queue_history(SINCE, items=150, seed=11)
    ids = sorted(Reservation.objects.filter(outcome="done").values_list("id", flat=True))
    in_flight = ids[len(ids) // 2]  # an attempt still running during the first run
    Reservation.objects.filter(id=in_flight).update(outcome=None, finished_at=None)
    first = trigger_values()
    assert first["from_id"] == 0 and first["as_of"]  # first run: everything
    one = run_and_publish(spark, first, 1)
    as_of_1 = dt.datetime.fromisoformat(first["as_of"])
    assert table() == expected_table(as_of_1) and one.metrics["rows"] == len(table()) > 0
    watermark_1 = SparkWatermark.objects.get(name="queue_analytics").value

    # New history after the first run, and one attempt that was still running then settles now.
    assert watermark_1 <= in_flight  # the watermark waits at the oldest attempt not settled
    seed_queue_history(SINCE + dt.timedelta(days=3), items=80, seed=12)
    Reservation.objects.filter(id=in_flight).update(outcome="done", finished_at=dt.datetime.now(dt.UTC))

    second = trigger_values()
    assert second["from_id"] == watermark_1  # since the last run
    run_and_publish(spark, second, 2)
    as_of_2 = dt.datetime.fromisoformat(second["as_of"])
    assert table() == expected_table(as_of_2)
    settled_done = Reservation.objects.filter(outcome="done", finished_at__lt=as_of_2).count()
    assert sum(row[0] for row in table().values()) == settled_done  # every done attempt counted exactly once
    assert SparkWatermark.objects.get(name="queue_analytics").value > watermark_1

    # Re-running the first run: its own window, the same numbers; publishing it moves nothing back.
    before, watermark_2 = table(), SparkWatermark.objects.get(name="queue_analytics").value
    again = run_and_publish(spark, first, 3)
    assert again.outputs["rows"] == one.outputs["rows"] and again.outputs["window"] == one.outputs["window"]
    assert table() == before
    assert SparkWatermark.objects.get(name="queue_analytics").value == watermark_2


def test_a_full_rebuild_starts_from_the_beginning_and_an_empty_window_is_nothing(spark, transactional_db):
    seed_queue_history(SINCE, items=60, seed=13)
    run_and_publish(spark, trigger_values(), 1)
    before = table()
    unchanged = trigger_values()
    run_and_publish(spark, unchanged, 2)  # nothing settled since: the same table
    assert table() == before == expected_table(dt.datetime.fromisoformat(unchanged["as_of"]))
    rebuild = trigger_values(full=True)
    assert rebuild["from_id"] == 0
    run_and_publish(spark, rebuild, 3)
    assert table() == expected_table(dt.datetime.fromisoformat(rebuild["as_of"]))


def test_a_fixed_window_and_incremental_fields_do_not_mix():
    from queue_app.spark.registry import SparkParamError

    with pytest.raises(SparkParamError, match="since/until choose a fixed window"):
        get_job("queue_analytics").validate({"since": "2025-03-10", "from_id": 5})
    with pytest.raises(SparkParamError, match="as_of: as_of needs a time zone"):
        get_job("queue_analytics").validate({"as_of": "2025-03-10T00:00:00"})
