"""Publishing queue analytics: one transaction replaces the run's window, so publishing twice never duplicates.

No JVM: the outputs are what a queue_analytics run returns.
"""

import pytest
from django.db import connection

from queue_app.spark.pipelines.queue_analytics import TABLE, ensure_tables, publish_hourly_stats

pytestmark = pytest.mark.django_db

STATS = {
    "processed": 5,
    "failed": 1,
    "dead": 0,
    "retries": 1,
    "wait_p50": 0.5,
    "wait_p95": 1.5,
    "wait_p99": 1.9,
    "run_p50": None,
    "run_p95": None,
    "run_p99": None,
}


def outputs(rows, *, queues=None, since="2025-03-10T00:00:00+00:00", until="2025-03-11T00:00:00+00:00"):
    return {
        "window": {"since": since, "until": until, "queues": queues},
        "rows": [{"queue": q, "task": t, "hour": h, **STATS, **extra} for q, t, h, extra in rows],
    }


def table():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT queue, task, hour, processed, run_id FROM {TABLE} ORDER BY 1, 2, 3")
        return [(q, t, h.isoformat(), p, r) for q, t, h, p, r in cursor.fetchall()]


@pytest.fixture(autouse=True)
def stats_table():
    ensure_tables()
    ensure_tables()  # idempotent


def test_publishing_the_same_run_twice_leaves_one_copy():
    run = outputs(
        [("default", "a", "2025-03-10T01:00:00+00:00", {}), ("default", "b", "2025-03-10T02:00:00+00:00", {})]
    )
    assert publish_hourly_stats(run, run_id=7) == 2
    publish_hourly_stats(run, run_id=7)
    assert table() == [
        ("default", "a", "2025-03-10T01:00:00+00:00", 5, 7),
        ("default", "b", "2025-03-10T02:00:00+00:00", 5, 7),
    ]


def test_a_rerun_replaces_its_window_and_leaves_other_hours():
    publish_hourly_stats(
        outputs(
            [("default", "a", "2025-03-09T23:00:00+00:00", {})],
            since="2025-03-09T00:00:00+00:00",
            until="2025-03-10T00:00:00+00:00",
        ),
        run_id=1,
    )
    publish_hourly_stats(
        outputs(
            [("default", "a", "2025-03-10T01:00:00+00:00", {}), ("default", "gone", "2025-03-10T05:00:00+00:00", {})]
        ),
        run_id=2,
    )
    publish_hourly_stats(outputs([("default", "a", "2025-03-10T01:00:00+00:00", {"processed": 9})]), run_id=3)
    assert table() == [
        ("default", "a", "2025-03-09T23:00:00+00:00", 5, 1),  # outside the window: untouched
        ("default", "a", "2025-03-10T01:00:00+00:00", 9, 3),  # recomputed
    ]  # ("default", "gone") is no longer in the window's computation, so it is no longer in the table


def test_a_run_filtered_to_some_queues_replaces_only_those_queues():
    publish_hourly_stats(
        outputs([("default", "a", "2025-03-10T01:00:00+00:00", {}), ("reports", "r", "2025-03-10T01:00:00+00:00", {})]),
        run_id=1,
    )
    publish_hourly_stats(outputs([], queues=["reports"]), run_id=2)
    assert table() == [("default", "a", "2025-03-10T01:00:00+00:00", 5, 1)]


def test_a_failed_publish_changes_nothing():
    publish_hourly_stats(outputs([("default", "a", "2025-03-10T01:00:00+00:00", {})]), run_id=1)
    broken = outputs(
        [("default", "a", "2025-03-10T02:00:00+00:00", {}), ("default", "a", "2025-03-10T02:00:00+00:00", {})]
    )
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        publish_hourly_stats(broken, run_id=2)  # the duplicate key fails the insert after the delete ran
    assert table() == [("default", "a", "2025-03-10T01:00:00+00:00", 5, 1)]
