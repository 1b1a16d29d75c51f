"""The queue analytics job's expected SQL and PostgreSQL's own figures for it, its published table, and a run that
publishes: for the Spark pipeline and incremental tests."""

import datetime as dt

from django.db import connection, transaction

from queue_app.spark.pipelines import queue_analytics
from queue_app.spark.registry import get_job
from tests.support.spark_fixtures import require_jdbc_for_tcp, seed_queue_history, spark_session  # noqa: F401  (`spark`)  # noqa: F401  (`spark`)

EXPECTED_SQL = """
WITH src AS (
    SELECT r.id, r.item_id, r.attempt, r.reserved_at, r.finished_at, r.outcome,
           i.queue_id AS queue, i.task, i.run_at, i.state AS item_state, i.reservation_id AS current_reservation_id
    FROM queue_app_reservation r JOIN queue_app_queueitem i ON i.id = r.item_id
), wait_sample AS (
    SELECT DISTINCT ON (item_id) id FROM src WHERE reserved_at >= run_at ORDER BY item_id, reserved_at, id
)
SELECT src.queue, src.task, date_trunc('hour', src.reserved_at, 'UTC') AS hour,
       count(*) FILTER (WHERE outcome = 'done') AS processed,
       count(*) FILTER (WHERE outcome IN ('retry', 'dead', 'timed_out', 'expired')) AS failed,
       count(*) FILTER (WHERE item_state = 'dead' AND current_reservation_id = src.id) AS dead,
       count(*) FILTER (WHERE attempt > 1) AS retries,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM reserved_at - run_at)::float8) FILTER (WHERE ws.id IS NOT NULL) AS wait,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - reserved_at)::float8)
           FILTER (WHERE outcome IN ('done', 'retry', 'dead', 'timed_out')) AS run
FROM src LEFT JOIN wait_sample ws ON ws.id = src.id
WHERE src.reserved_at >= %(since)s AND src.reserved_at < %(until)s AND (%(all_queues)s OR src.queue = ANY(%(queues)s))
GROUP BY 1, 2, 3
"""


SINCE = dt.datetime(2025, 3, 10, tzinfo=dt.UTC)


AS_OF_SQL = EXPECTED_SQL.replace(
    "WHERE src.reserved_at >= %(since)s", "WHERE src.finished_at < %(as_of)s AND src.reserved_at >= %(since)s"
)


def expected_table(as_of):
    """PostgreSQL's own figures for every hour, counting the attempts settled before `as_of`."""
    params = {"since": dt.datetime(2000, 1, 1, tzinfo=dt.UTC), "until": as_of, "as_of": as_of}
    with connection.cursor() as cursor:
        cursor.execute(AS_OF_SQL, {**params, "all_queues": True, "queues": []})
        return {(q, t, h.astimezone(dt.UTC)): (p, f, d, r) for q, t, h, p, f, d, r, _w, _r in cursor.fetchall()}


def table():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT queue, task, hour, processed, failed, dead, retries FROM {queue_analytics.TABLE}")
        return {(q, t, h.astimezone(dt.UTC)): (p, f, d, r) for q, t, h, p, f, d, r in cursor.fetchall()}


def trigger_values(**raw):
    """What trigger_run stores for a manual trigger with `raw` (validate, then the job's prepare)."""
    job = get_job("queue_analytics")
    return job.validate(job.dump_params(job.prepare(job.validate(raw))))


def run_and_publish(spark, values, run_id):
    result = get_job("queue_analytics").func(spark, values)
    with transaction.atomic():
        queue_analytics.publish_hourly_stats(result.outputs, run_id)
    return result
