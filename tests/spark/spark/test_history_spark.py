"""The Spark queue analytics across the split: an incremental run after the archiver moved finished items (and
their reservations) into the history tables counts the same as it would have on the old layout, and its
watermark (a reservation id) still holds, since the move keeps ids."""

import datetime as dt

import pytest
from django.db import transaction

from queue_app import engine
from queue_app.models import ItemHistory, ReservationHistory
from queue_app.spark.models import SparkWatermark
from tests.support.spark_analytics import SINCE, expected_table, run_and_publish, table, trigger_values
from tests.support.spark_fixtures import seed_queue_history, spark_session  # noqa: F401  (`spark`)

pytestmark = pytest.mark.spark


def test_incremental_analytics_count_archived_attempts_once(spark, transactional_db):
    seed_queue_history(SINCE, items=120, seed=21)
    first = trigger_values()
    run_and_publish(spark, first, 1)
    watermark_1 = SparkWatermark.objects.get(name="queue_analytics").value

    seed_queue_history(SINCE + dt.timedelta(days=3), items=60, seed=22)
    second = trigger_values()
    expected = expected_table(dt.datetime.fromisoformat(second["as_of"]))  # on the old layout: all rows hot
    with transaction.atomic():
        moved = engine.archive(100_000, grace=0)
    assert moved == ItemHistory.objects.count() > 0 and ReservationHistory.objects.count() > moved

    result = run_and_publish(spark, second, 2)
    assert second["from_id"] == watermark_1
    assert table() == expected
    assert result.metrics["rows"] > 0
    assert SparkWatermark.objects.get(name="queue_analytics").value > watermark_1
