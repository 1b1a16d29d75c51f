"""Queue analytics: per queue, task and hour (UTC), what the queue did, computed by Spark from its own history.

Reads reservations joined to their items, hot and archived alike (the views queue_app_reservation_all and
queue_app_item_all of migration 0017: one statement sees a row once, wherever the archiver has it; the archiver
keeps ids, so the watermark below holds across the move), from PostgreSQL (JDBC over TCP, psycopg over a unix
socket; see queue_app/spark/db.py). The child returns the small aggregated rows as the run's outputs; the caller
publishes them with `publish_hourly_stats()` in the transaction that marks the run succeeded, so a re-delivered or
re-run run replaces its window instead of adding to it.

Two ways to choose what to compute:

* a fixed window: `since`/`until` (days, UTC) recompute those hours from every attempt reserved in them.
* incremental (neither given; a manual trigger's default): everything settled since the last successful run.
  When the run is triggered, `prepare()` fixes its `as_of` (now) and `from_id` (the watermark: the lowest
  reservation id that was not settled as of the last successful run; 0 on the first run, or with `full=true`, a
  rebuild). The run recomputes every hour from the first one holding a reservation with id >= from_id up to
  as_of, counting attempts reserved in them and settled before as_of (one still running is counted by a later
  run, once settled), and returns the new watermark. Publishing replaces those hours, except rows a later
  as_of already wrote, and advances the watermark (never back) in the transaction that marks the run
  succeeded. So each attempt is counted exactly once in the table, and a re-run of a run (same as_of and
  from_id) computes the same numbers and changes nothing newer. The reads use the primary key instead of
  scanning the history: every reservation made at or after an id mark's time has a higher id than the mark's
  (engine/marks.py), so the first hour's reads start one past the newest mark taken before that hour, exactly.
  Without such a mark (none taken yet, or the hour is older than the marks kept), a binary search of
  reserved_at over the primary key finds the hour's first id, less ID_MARGIN for transactions that got their id
  late: close, not exact (a lease in a transaction open longer than the margin could fall before it).

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

from queue_app.engine.alias import atomic, connection
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

# The rows every read takes: reservations with their items' queue, task, due time and state (the reads below add
# their WHERE clauses; source_queries() picks one).
SOURCE_ROWS = """
SELECT r.id, r.item_id, r.attempt, r.reserved_at, r.finished_at, r.outcome,
       i.queue_id AS queue, i.task, i.run_at, i.state AS item_state, i.reservation_id AS current_reservation_id
FROM queue_app_reservation_all r
JOIN queue_app_item_all i ON i.id = r.item_id
"""

# Every reservation of an item that has an attempt in the window, up to the window's end: the wait sample of an
# item is its first reservation at or after run_at, which may lie before the window and must be seen to rule
# out a later one in it.
SOURCE_SQL = (
    SOURCE_ROWS
    + """WHERE r.reserved_at < %(until)s
  AND r.item_id IN (
      SELECT item_id FROM queue_app_reservation_all WHERE reserved_at >= %(since)s AND reserved_at < %(until)s)
  AND (%(all_queues)s OR i.queue_id = ANY(%(queues)s))
"""
)

# Spreads the JDBC range reads; one scan instead of running SOURCE_SQL's semi-join once more.
SOURCE_ID_BOUNDS = """
SELECT min(id), max(id) FROM queue_app_reservation_all WHERE reserved_at >= %(since)s AND reserved_at < %(until)s
"""

# Incremental: every reservation of an item with an attempt in [since, until) at or after lo_id (the primary
# key range that holds the window), reserved before until.
SOURCE_SQL_FROM_ID = (
    SOURCE_ROWS
    + """WHERE r.reserved_at < %(until)s AND r.id < %(until_id)s
  AND r.item_id IN (
      SELECT item_id FROM queue_app_reservation_all
      WHERE id >= %(lo_id)s AND id < %(until_id)s AND reserved_at >= %(since)s AND reserved_at < %(until)s)
  AND (%(all_queues)s OR i.queue_id = ANY(%(queues)s))
"""
)
# A rebuild (from the first reservation): every reservation before until_id reserved before as_of is in the
# window, so the item semi-join above would keep every row; without it each JDBC range read scans the table once
# instead of twice and hashes no item ids (EXPLAIN on 10M: two sequential scans and a 10M-row hash per range).
SOURCE_SQL_REBUILD = (
    SOURCE_ROWS
    + """WHERE r.reserved_at < %(until)s AND r.id < %(until_id)s
  AND (%(all_queues)s OR i.queue_id = ANY(%(queues)s))
"""
)
SOURCE_ID_BOUNDS_FROM_ID = """
SELECT min(id), max(id) FROM queue_app_reservation_all
WHERE id >= %(lo_id)s AND id < %(until_id)s AND reserved_at >= %(since)s AND reserved_at < %(until)s
"""
# Where an incremental run starts (the first reservation at or after the watermark) and its next watermark (the
# lowest id not settled as of its as_of, else until_id): both walk the primary key from the watermark. A run
# sees the reservations that existed when it was triggered (id < until_id) settled before its as_of.
INCREMENTAL_START = """
SELECT min(reserved_at) FILTER (WHERE reserved_at < %(as_of)s),
       coalesce(min(id) FILTER (WHERE finished_at IS NULL OR finished_at >= %(as_of)s), %(until_id)s)
FROM queue_app_reservation_all WHERE id >= %(from_id)s AND id < %(until_id)s
"""
NEXT_ID = "SELECT coalesce(max(id), 0) + 1 FROM queue_app_reservation_all"
ID_RANGE = "SELECT min(id), max(id) FROM queue_app_reservation_all"
FIRST_AT_OR_AFTER = "SELECT id, reserved_at FROM queue_app_reservation_all WHERE id >= %s ORDER BY id LIMIT 1"
ID_MARGIN = dt.timedelta(minutes=10)
MARK_BEFORE = "SELECT reservation_id FROM queue_app_idmark WHERE taken_at < %s ORDER BY taken_at DESC LIMIT 1"

DELETE_WINDOW = f"""
DELETE FROM {TABLE}
WHERE hour >= %(since)s AND hour < %(until)s AND (%(all_queues)s OR queue = ANY(%(queues)s))
"""
INSERT_ROW = f"""
INSERT INTO {TABLE} (queue, task, hour, {", ".join(STAT_COLUMNS)}, computed_at, run_id, as_of)
VALUES (%(queue)s, %(task)s, %(hour)s, {", ".join(f"%({c})s" for c in STAT_COLUMNS)}, now(), %(run_id)s, %(as_of)s)
"""
# An incremental run replaces the rows of its window that no later as_of wrote; a row a later as_of wrote stays.
INSERT_ROW_AS_OF = (
    INSERT_ROW.rstrip()
    + f"""
ON CONFLICT (queue, task, hour) DO UPDATE
SET {", ".join(f"{c} = EXCLUDED.{c}" for c in STAT_COLUMNS)}, computed_at = now(), run_id = EXCLUDED.run_id,
    as_of = EXCLUDED.as_of
WHERE {TABLE}.as_of IS NULL OR {TABLE}.as_of <= EXCLUDED.as_of
"""
)
DELETE_WINDOW_AS_OF = DELETE_WINDOW.rstrip() + " AND (as_of IS NULL OR as_of <= %(as_of)s)\n"

FAILED_OUTCOMES = ("retry", "dead", "timed_out", "expired")
RUN_OUTCOMES = ("done", "retry", "dead", "timed_out")
PERCENTILES = (0.5, 0.95, 0.99)


def is_incremental(params: Mapping[str, Any]) -> bool:
    return not params.get("since") and not params.get("until")


def watermark_name(queues: list[str]) -> str:
    return "queue_analytics" + (f"[{','.join(sorted(queues))}]" if queues else "")


def prepare(values: dict[str, Any]) -> dict[str, Any]:
    """At trigger time, fix an incremental run's window: as_of = now, from_id = the watermark (0: first run or
    full rebuild). Values already set (a re-run's) are kept."""
    if not is_incremental(values):
        return values
    from queue_app.spark import watermark

    values = dict(values)
    values["as_of"] = values.get("as_of") or dt.datetime.now(dt.UTC).isoformat()
    if values.get("until_id") is None:
        with connection.cursor() as cursor:
            cursor.execute(NEXT_ID)
            values["until_id"] = cursor.fetchone()[0]
    if values.get("from_id") is None:
        values["from_id"] = 0 if values.get("full") else (watermark.read(watermark_name(queue_list(values))) or 0)
    return values


def _as_of(params: Mapping[str, Any]) -> dt.datetime:
    text = params.get("as_of")
    if not text:
        return dt.datetime.now(dt.UTC)
    value = dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("as_of needs a time zone, e.g. 2025-03-10T12:00:00+00:00")
    return value.astimezone(dt.UTC)


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
    incremental_only = (
        params.get("as_of") or params.get("full") or {params.get("from_id"), params.get("until_id")} != {None}
    )
    if not is_incremental(params) and incremental_only:
        errors["since"] = (
            "since/until choose a fixed window; leave them empty for an incremental run (as_of, from_id, full)"
        )
    try:
        _as_of(params)
    except ValueError as exc:
        errors["as_of"] = str(exc) if "time zone" in str(exc) else f"must be an ISO 8601 time, got {params['as_of']!r}"
    # Checked where the run is triggered and again by the launcher before the JVM starts: a run that cannot
    # load the driver fails at once with this message and is not retried (reader=auto falls back instead).
    if params.get("reader") == "jdbc" and jdbc_jar() is None:
        errors["reader"] = f"{missing_jar_message()}; reader=auto reads through psycopg instead"
    return errors


def ensure_tables() -> None:
    """Create the published table if it is missing (until its model and migration exist)."""
    with connection.cursor() as cursor:
        cursor.execute(DDL)


def publish_hourly_stats(outputs: Mapping[str, Any], run_id: int | str | None) -> int:
    """Replace the run's window (its hours, and its queues when it was filtered) with the run's rows.

    Runs in one transaction (a savepoint when the caller already opened one, as the worker does to mark the run
    succeeded in the same commit): publishing the same outputs twice leaves the same table.
    """
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
    as_of = dt.datetime.fromisoformat(win["as_of"]) if win.get("as_of") else None
    scope["as_of"] = as_of
    for row in rows:
        row["as_of"] = as_of
    with atomic(), connection.cursor() as cursor:
        cursor.execute(DELETE_WINDOW if as_of is None else DELETE_WINDOW_AS_OF, scope)
        if rows:
            cursor.executemany(INSERT_ROW if as_of is None else INSERT_ROW_AS_OF, rows)
        if as_of is not None:
            from queue_app.spark import watermark

            watermark.advance(watermark_name(scope["queues"]), win["watermark"], as_of, run_id)
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


def hourly_stats(attempts, since: dt.datetime, until: dt.datetime, *, settled_before: dt.datetime | None = None):
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
    if settled_before is not None:  # incremental: what was settled as of the run's as_of, nothing later
        in_window &= F.col("finished_at") < F.lit(settled_before)
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
        Param("since", "date", help="First day (UTC) of a fixed window; empty: since the last run."),
        Param("until", "date", help="Day after a fixed window's last (exclusive); default: the day after since."),
        Param("queues", "str", default="", help="Comma-separated queue names; empty: every queue."),
        Param("reader", "choice", choices=READERS, default="auto", help="How to read PostgreSQL."),
        Param("partitions", "int", default=4, min=1, max=64, help="Parallel JDBC range reads."),
        Param("full", "bool", default=False, help="Incremental runs: recompute everything (a rebuild)."),
        Param("from_id", "int", min=0, help="Set when triggered: the watermark this run starts from."),
        Param("as_of", "str", help="Set when triggered: attempts settled before this time are counted."),
        Param("until_id", "int", min=0, help="Set when triggered: reservations before this id are counted."),
    ],
    publish=publish_hourly_stats,
    check=_check,
    prepare=prepare,
)
def queue_analytics(spark, params: Mapping[str, Any]) -> JobResult:
    queues = queue_list(params)
    window_out: dict[str, Any] = {"queues": queues or None}
    settled_before = None
    if is_incremental(params):
        as_of = _as_of(params)
        until_id = params.get("until_id")
        start, lo_id, next_watermark, until_id = incremental_start(params.get("from_id") or 0, as_of, until_id)
        since = _hour_floor(start) if start is not None else as_of
        until, settled_before = as_of, as_of
        window_out.update(as_of=as_of.isoformat(), watermark=next_watermark, from_id=params.get("from_id") or 0)
        query, bounds = source_queries(params.get("from_id") or 0)
    else:
        since, until = window(params)
        lo_id, until_id, query, bounds = 0, None, SOURCE_SQL, SOURCE_ID_BOUNDS
    rows, reader = [], "none"
    if since < until:
        attempts, reader = read_postgres(
            spark,
            query,
            {
                "since": since,
                "until": until,
                "all_queues": not queues,
                "queues": queues,
                "lo_id": lo_id,
                "until_id": until_id,
            },
            schema=_source_schema(),
            reader=params.get("reader") or "auto",
            partition_column="id",
            num_partitions=params.get("partitions") or 4,
            bounds_query=bounds,
        )
        stats = hourly_stats(attempts, since, until, settled_before=settled_before)
        for r in stats.orderBy("queue", "task", "hour_epoch").collect():
            row = r.asDict()
            row["hour"] = dt.datetime.fromtimestamp(row.pop("hour_epoch"), dt.UTC).isoformat()
            rows.append(row)
    attempts_in_window = sum(row.pop("attempts") for row in rows)
    window_out.update(since=since.isoformat(), until=until.isoformat())
    return JobResult(
        metrics={
            "since": since.isoformat(),
            "until": until.isoformat(),
            "reader": reader,
            "attempts": attempts_in_window,
            "rows": len(rows),
            "queues": len({r["queue"] for r in rows}),
            "tasks": len({(r["queue"], r["task"]) for r in rows}),
            **({"from_id": window_out["from_id"], "watermark": window_out["watermark"]} if settled_before else {}),
        },
        outputs={"window": window_out, "rows": rows},
    )


def source_queries(from_id: int) -> tuple[str, str]:
    """(rows, id bounds) SQL of an incremental run from watermark `from_id`: the one place that says which
    tables the reservations are read from."""
    return (SOURCE_SQL_REBUILD if from_id == 0 else SOURCE_SQL_FROM_ID), SOURCE_ID_BOUNDS_FROM_ID


def _hour_floor(when: dt.datetime) -> dt.datetime:
    return when.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def incremental_start(
    from_id: int, as_of: dt.datetime, until_id: int | None
) -> tuple[dt.datetime | None, int, int, int]:
    """(first reserved_at at or after the watermark, the first id of its hour less ID_MARGIN, the next watermark,
    until_id), read with a few primary-key lookups on the driver."""
    import psycopg

    from queue_app.spark.db import postgres_source

    with psycopg.connect(**postgres_source().psycopg_kwargs(), autocommit=True) as conn:
        if until_id is None:  # launched without a trigger (no prepare): what exists now
            until_id = conn.execute(NEXT_ID).fetchone()[0]
        scope = {"from_id": from_id, "as_of": as_of, "until_id": until_id}
        start, next_watermark = conn.execute(INCREMENTAL_START, scope).fetchone()
        if start is None:
            return None, from_id, next_watermark, until_id
        return start, lowest_id_at(conn, _hour_floor(start)), next_watermark, until_id


def lowest_id_at(conn, when: dt.datetime) -> int:
    """An id at or below that of every reservation made at or after `when`: one past the newest id mark taken
    before `when` (exact), else the binary search less ID_MARGIN (see the module docstring)."""
    mark = conn.execute(MARK_BEFORE, (when,)).fetchone()
    if mark is not None:
        return mark[0] + 1
    return first_id_at(conn, when - ID_MARGIN)


def first_id_at(conn, when: dt.datetime) -> int:
    """The smallest reservation id reserved at or after `when`, by binary search on the primary key (ids follow
    reserved_at, see the module docstring)."""
    lo, hi = conn.execute(ID_RANGE).fetchone()
    if lo is None:
        return 0
    hi += 1
    while lo < hi:
        mid = (lo + hi) // 2
        row = conn.execute(FIRST_AT_OR_AFTER, (mid,)).fetchone()
        if row is None or row[1] >= when:
            hi = mid
        else:
            lo = row[0] + 1
    return lo
