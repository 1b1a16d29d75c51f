"""Queue analytics: per queue, task and hour (UTC), what the queue did, computed by Spark from its own history.

Reads reservations joined to their items from PostgreSQL (JDBC over TCP, psycopg over a unix socket; see
queue_app/spark/db.py). The child returns the small aggregated rows as the run's outputs; the caller publishes
them with `publish_hourly_stats()` in the transaction that marks the run succeeded, so a re-delivered or
re-run run replaces its window instead of adding to it.

Definitions (every attempt is one reservation, bucketed by the hour of its `reserved_at`):

* processed  attempts with outcome `done`.
* failed     attempts that spent an attempt without succeeding: outcome `retry`, `dead`, `timed_out`, `expired`.
* dead       attempts after which the item is dead: the item's current reservation, item state `dead`
             (whether the last attempt failed, timed out or its lease expired).
* retries    attempts with attempt number > 1 (every re-delivery, after backoff or an expired lease).
* wait       `reserved_at - run_at` on the attempt that `run_at` scheduled: the item's first reservation at or
             after its `run_at`. One sample per item: the first attempt of an item that never failed, the attempt
             after the last backoff of one that did. The engine overwrites `run_at` on each retry, so earlier
             attempts of a retried item have no recorded due time and are not sampled.
* run        `finished_at - reserved_at` of attempts that ended through the handler: outcome `done`, `retry`,
             `dead`, `timed_out` (an expired lease's finish time is when the rescue noticed it, not a run time).
* p50/p95/p99  exact, linearly interpolated percentiles in seconds: Spark's `percentile`, PostgreSQL's
             `percentile_cont`; NULL when the hour has no sample.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from queue_app.spark.db import READERS, missing_jar_message, read_postgres
from queue_app.spark.registry import JobResult, Param, spark_job
from queue_app.spark.session import jdbc_jar

TABLE = "queue_app_queuestats_hourly"

# The published table; the model and migration are written from this DDL.
DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    queue       varchar(100) NOT NULL,
    task        varchar(200) NOT NULL,
    hour        timestamptz NOT NULL,
    processed   bigint NOT NULL DEFAULT 0,
    failed      bigint NOT NULL DEFAULT 0,
    dead        bigint NOT NULL DEFAULT 0,
    retries     bigint NOT NULL DEFAULT 0,
    wait_p50    double precision,
    wait_p95    double precision,
    wait_p99    double precision,
    run_p50     double precision,
    run_p95     double precision,
    run_p99     double precision,
    computed_at timestamptz NOT NULL DEFAULT now(),
    run_id      bigint,
    PRIMARY KEY (queue, task, hour)
);
CREATE INDEX IF NOT EXISTS queuestats_hourly_hour ON {TABLE} (hour);
"""

STAT_COLUMNS = (
    "processed",
    "failed",
    "dead",
    "retries",
    "wait_p50",
    "wait_p95",
    "wait_p99",
    "run_p50",
    "run_p95",
    "run_p99",
)

# Every reservation of an item that has an attempt in the window, up to the window's end: the wait sample of an
# item is its first reservation at or after run_at, which may lie before the window and must be seen to rule
# out a later one in it.
SOURCE_SQL = """
SELECT r.id, r.item_id, r.attempt, r.reserved_at, r.finished_at, r.outcome,
       i.queue_id AS queue, i.task, i.run_at, i.state AS item_state, i.reservation_id AS current_reservation_id
FROM queue_app_reservation r
JOIN queue_app_queueitem i ON i.id = r.item_id
WHERE r.reserved_at < %(until)s
  AND r.item_id IN (
      SELECT item_id FROM queue_app_reservation WHERE reserved_at >= %(since)s AND reserved_at < %(until)s)
  AND (%(all_queues)s OR i.queue_id = ANY(%(queues)s))
"""

# Spreads the JDBC range reads; one scan instead of running SOURCE_SQL's semi-join once more.
SOURCE_ID_BOUNDS = """
SELECT min(id), max(id) FROM queue_app_reservation WHERE reserved_at >= %(since)s AND reserved_at < %(until)s
"""

DELETE_WINDOW = f"""
DELETE FROM {TABLE}
WHERE hour >= %(since)s AND hour < %(until)s AND (%(all_queues)s OR queue = ANY(%(queues)s))
"""
INSERT_ROW = f"""
INSERT INTO {TABLE} (queue, task, hour, {", ".join(STAT_COLUMNS)}, computed_at, run_id)
VALUES (%(queue)s, %(task)s, %(hour)s, {", ".join(f"%({c})s" for c in STAT_COLUMNS)}, now(), %(run_id)s)
"""

FAILED_OUTCOMES = ("retry", "dead", "timed_out", "expired")
RUN_OUTCOMES = ("done", "retry", "dead", "timed_out")
PERCENTILES = (0.5, 0.95, 0.99)


def window(params: Mapping[str, Any]) -> tuple[dt.datetime, dt.datetime]:
    """[since, until) as UTC datetimes; since defaults to yesterday (UTC), until to the day after since."""
    since = params.get("since") or (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1))
    until = params.get("until") or since + dt.timedelta(days=1)
    return (
        dt.datetime.combine(since, dt.time(), tzinfo=dt.UTC),
        dt.datetime.combine(until, dt.time(), tzinfo=dt.UTC),
    )


def queue_list(params: Mapping[str, Any]) -> list[str]:
    return [q.strip() for q in (params.get("queues") or "").split(",") if q.strip()]


def _check(params: Mapping[str, Any]) -> dict[str, str]:
    errors = {}
    since, until = window(params)
    if until <= since:
        errors["until"] = f"must be after since ({since.date()}); until is exclusive"
    # Checked where the run is triggered and again by the launcher before the JVM starts: a run that cannot
    # load the driver fails at once with this message and is not retried (reader=auto falls back instead).
    if params.get("reader") == "jdbc" and jdbc_jar() is None:
        errors["reader"] = f"{missing_jar_message()}; reader=auto reads through psycopg instead"
    return errors


def ensure_tables() -> None:
    """Create the published table if it is missing (until its model and migration exist)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(DDL)


def publish_hourly_stats(outputs: Mapping[str, Any], run_id: int | str | None) -> int:
    """Replace the run's window (its hours, and its queues when it was filtered) with the run's rows.

    Runs in one transaction (a savepoint when the caller already opened one, as the worker does to mark the run
    succeeded in the same commit): publishing the same outputs twice leaves the same table.
    """
    from django.db import connection, transaction

    win = outputs["window"]
    scope = {
        "since": dt.datetime.fromisoformat(win["since"]),
        "until": dt.datetime.fromisoformat(win["until"]),
        "all_queues": not win["queues"],
        "queues": list(win["queues"] or []),
    }
    rows = [
        {**row, "hour": dt.datetime.fromisoformat(row["hour"]), "run_id": None if run_id is None else int(run_id)}
        for row in outputs["rows"]
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(DELETE_WINDOW, scope)
        if rows:
            cursor.executemany(INSERT_ROW, rows)
    return len(rows)


def _source_schema():
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("item_id", T.LongType()),
            T.StructField("attempt", T.LongType()),
            T.StructField("reserved_at", T.TimestampType()),
            T.StructField("finished_at", T.TimestampType()),
            T.StructField("outcome", T.StringType()),
            T.StructField("queue", T.StringType()),
            T.StructField("task", T.StringType()),
            T.StructField("run_at", T.TimestampType()),
            T.StructField("item_state", T.StringType()),
            T.StructField("current_reservation_id", T.LongType()),
        ]
    )


def hourly_stats(attempts, since: dt.datetime, until: dt.datetime):
    """The per (queue, task, hour) DataFrame from reservation rows shaped like SOURCE_SQL's output."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def seconds(later, earlier):
        return later.cast("double") - earlier.cast("double")

    reserved_at, run_at = F.col("reserved_at"), F.col("run_at")
    # The item's first reservation at or after run_at (ties broken by id) carries its wait sample.
    first_due = F.min(F.when(reserved_at >= run_at, F.struct(reserved_at, F.col("id")))).over(
        Window.partitionBy("item_id")
    )
    outcome = F.col("outcome")
    sampled = attempts.withColumn(
        "wait", F.when(first_due["id"] == F.col("id"), seconds(reserved_at, run_at))
    ).withColumn("run", F.when(outcome.isin(*RUN_OUTCOMES), seconds(F.col("finished_at"), reserved_at)))
    in_window = (reserved_at >= F.lit(since)) & (reserved_at < F.lit(until))
    died_here = (F.col("item_state") == "dead") & (F.col("current_reservation_id") == F.col("id"))

    def count_if(cond):
        return F.count(F.when(cond, 1))

    stats = (
        sampled.where(in_window)
        .groupBy("queue", "task", F.date_trunc("hour", reserved_at).alias("hour"))
        .agg(
            count_if(outcome == "done").alias("processed"),
            count_if(outcome.isin(*FAILED_OUTCOMES)).alias("failed"),
            count_if(died_here).alias("dead"),
            count_if(F.col("attempt") > 1).alias("retries"),
            F.count("*").alias("attempts"),
            F.percentile("wait", list(PERCENTILES)).alias("wait_p"),
            F.percentile("run", list(PERCENTILES)).alias("run_p"),
        )
    )
    return stats.select(
        "queue",
        "task",
        F.unix_timestamp("hour").alias("hour_epoch"),
        "processed",
        "failed",
        "dead",
        "retries",
        "attempts",
        *[F.col("wait_p")[i].alias(f"wait_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)],
        *[F.col("run_p")[i].alias(f"run_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)],
    )


@spark_job(
    "queue_analytics",
    description="Per queue, task and hour: processed, failed, dead, retries, wait and run time percentiles.",
    params=[
        Param("since", "date", help="First day (UTC) to compute; default: yesterday."),
        Param("until", "date", help="Day after the last one (exclusive); default: the day after since."),
        Param("queues", "str", default="", help="Comma-separated queue names; empty: every queue."),
        Param("reader", "choice", choices=READERS, default="auto", help="How to read PostgreSQL."),
        Param("partitions", "int", default=4, min=1, max=64, help="Parallel JDBC range reads."),
    ],
    publish=publish_hourly_stats,
    check=_check,
)
def queue_analytics(spark, params: Mapping[str, Any]) -> JobResult:
    since, until = window(params)
    queues = queue_list(params)
    attempts, reader = read_postgres(
        spark,
        SOURCE_SQL,
        {"since": since, "until": until, "all_queues": not queues, "queues": queues},
        schema=_source_schema(),
        reader=params.get("reader") or "auto",
        partition_column="id",
        num_partitions=params.get("partitions") or 4,
        bounds_query=SOURCE_ID_BOUNDS,
    )
    rows = []
    for r in hourly_stats(attempts, since, until).orderBy("queue", "task", "hour_epoch").collect():
        row = r.asDict()
        row["hour"] = dt.datetime.fromtimestamp(row.pop("hour_epoch"), dt.UTC).isoformat()
        rows.append(row)
    attempts_in_window = sum(row.pop("attempts") for row in rows)
    return JobResult(
        metrics={
            "since": since.isoformat(),
            "until": until.isoformat(),
            "reader": reader,
            "attempts": attempts_in_window,
            "rows": len(rows),
            "queues": len({r["queue"] for r in rows}),
            "tasks": len({(r["queue"], r["task"]) for r in rows}),
        },
        outputs={
            "window": {"since": since.isoformat(), "until": until.isoformat(), "queues": queues or None},
            "rows": rows,
        },
    )
