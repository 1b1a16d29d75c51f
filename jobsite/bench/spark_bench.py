"""The Spark benchmark behind `manage.py spark_bench`: from one run,

* start-up: a bare `spark-submit` of a small PySpark script against the same script run by path through
  jobsite's launcher (its status-API progress, event log): total time, and jobsite's trigger -> first task;
* warm: a registered function cold through spark-submit against the same function through a Spark Connect server
  (connect.py) started by the bench: trigger -> first task done, and total;
* analytics: queue_analytics as a full rebuild and as an incremental run against PostgreSQL computing the
  same aggregates (the test suite's definition SQL) over the same rows, read by the same SQL as the run (so
  both use the primary-key range an incremental run starts from).

History goes into its own queue (`spark-bench`), ids in reserved_at order as the engine's leases make them,
generated set-based (generate_series, 1M rows a statement: 10M in about 2.5 minutes), and is deleted at the end
with its published rows and watermark (with --keep, only the new rows: the next --keep run of the same size
reuses the history). The Spark side runs in this process (a local
SparkSession, JVM started once, as a worker's run would find it warm); it reads PostgreSQL over JDBC when the
database is on TCP, else through psycopg (printed).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

QUEUE = "spark-bench"
PI = """import sys
from operator import add
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("BenchPi").getOrCreate()
n = int(sys.argv[1])
rdd = spark.sparkContext.parallelize(range(n), 2)
print(rdd.map(lambda i: 1 if (i * 7919 % 1000) ** 2 < 500000 else 0).reduce(add))
spark.stop()
"""
SEED_ITEMS = """
INSERT INTO queue_app_queueitem (task, payload, state, priority, run_at, visible_at, attempts, max_attempts, error,
                                 created_at, updated_at, queue_id, finished_at)
SELECT 'bench.task' || (g %% 3), '{}'::jsonb, 'done', 0, t, t, 1, 5, '', t, t, %(queue)s, t + interval '2 seconds'
FROM (SELECT g, %(start)s::timestamptz + g * %(step)s::float8 * interval '1 second' AS t
      FROM generate_series(%(first)s, %(last)s) g) s
"""
# One attempt per item, in id order as leases make them (ids follow reserved_at). The items' reservation_id is
# left NULL: they are `done`, so the current-reservation test only matters for dead items (none here), and
# linking 10M items would rewrite the whole item table once more.
SEED_RESERVATIONS = """
INSERT INTO queue_app_reservation (attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at, finished_at,
                                   outcome, error, traceback, item_id)
SELECT 1, %(worker)s, run_at + (id %% 7) * interval '1 second', run_at + interval '60 seconds', run_at,
       run_at + (id %% 7) * interval '1 second' + (id %% 13) * interval '100 milliseconds',
       CASE WHEN id %% 20 = 0 THEN 'retry' ELSE 'done' END, '', '', id
FROM queue_app_queueitem WHERE queue_id = %(queue)s AND id > %(after)s ORDER BY id
"""
SEED_CHUNK = 1_000_000  # rows per statement: progress to print, and no single 10M-row transaction
HISTORY, NEW = "bench", "bench-new"  # the reservations' worker_id: history (kept with --keep) and new rows


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def seed(n: int, start: dt.datetime, span: dt.timedelta, *, worker: str = HISTORY, out=None) -> None:
    """`n` done items of QUEUE, one attempt each, spread evenly over [start, start + span), set-based (generate_series),
    in chunks of SEED_CHUNK rows."""
    from queue_app import engine

    engine.ensure_queue(QUEUE)
    step = span.total_seconds() / n
    with connection.cursor() as cur:
        for first in range(1, n + 1, SEED_CHUNK):
            last = min(n, first + SEED_CHUNK - 1)
            cur.execute("SELECT coalesce(max(id), 0) FROM queue_app_item_all")  # a worker may archive the seed
            after = cur.fetchone()[0]
            with transaction.atomic():
                params = {"queue": QUEUE, "start": start, "step": step, "first": first, "last": last}
                cur.execute(SEED_ITEMS, params)
                cur.execute(SEED_RESERVATIONS, {"queue": QUEUE, "after": after, "worker": worker})
            if out and n > SEED_CHUNK:
                out(f"  seeded {last:,} of {n:,}")
        cur.execute("ANALYZE queue_app_reservation")
        cur.execute("ANALYZE queue_app_queueitem")


def seeded_history() -> int:
    """Reservations of history QUEUE holds (a --keep run's), or -1 when it also holds other rows."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE r.worker_id = %s), count(*) FROM queue_app_reservation_all r "
            "JOIN queue_app_item_all i ON i.id = r.item_id WHERE i.queue_id = %s",
            [HISTORY, QUEUE],
        )
        history, every = cur.fetchone()
    return history if history == every else -1


def cleanup(*, keep_history: bool = False) -> None:
    """Delete what the bench wrote: its items and reservations (only the new ones with `keep_history`), hot and
    archived (a worker on this database archives the seeded items, all finished), its published rows and its
    watermark."""
    from queue_app.spark.pipelines.queue_analytics import TABLE, watermark_name

    with transaction.atomic(), connection.cursor() as cur:
        items = "SELECT id FROM queue_app_item_all WHERE queue_id = %s"
        if keep_history:
            new_items = f"SELECT item_id AS id FROM queue_app_reservation_all WHERE worker_id = '{NEW}'"
            items = f"{new_items} AND item_id IN ({items})"
        cur.execute(f"CREATE TEMP TABLE bench_gone ON COMMIT DROP AS {items}", [QUEUE])
        for table in ("queue_app_reservation", "queue_app_reservationhistory"):
            cur.execute(f"DELETE FROM {table} WHERE item_id IN (SELECT id FROM bench_gone)")
        for table in ("queue_app_queueitem", "queue_app_itemhistory"):
            cur.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM bench_gone)")
        cur.execute(f"DELETE FROM {TABLE} WHERE queue = %s", [QUEUE])
        cur.execute("DELETE FROM queue_app_sparkwatermark WHERE name = %s", [watermark_name([QUEUE])])


def postgres_aggregate(source_sql: str, scope: dict[str, Any]) -> float:
    """Seconds PostgreSQL takes for the same per (queue, task, hour) figures over the same rows, read with the
    same SQL as the Spark run (`scope`: its since, until, until_id and lo_id), so both use the same indexes."""
    sql = f"""
    WITH src AS ({source_sql}), wait_sample AS (
        SELECT DISTINCT ON (item_id) id FROM src WHERE reserved_at >= run_at ORDER BY item_id, reserved_at, id)
    SELECT src.queue, src.task, date_trunc('hour', src.reserved_at, 'UTC'),
           count(*) FILTER (WHERE outcome = 'done'), count(*) FILTER (WHERE outcome <> 'done'),
           count(*) FILTER (WHERE attempt > 1),
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM reserved_at - run_at))
               FILTER (WHERE ws.id IS NOT NULL),
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - reserved_at))
    FROM src LEFT JOIN wait_sample ws ON ws.id = src.id
    WHERE src.reserved_at >= %(since)s AND src.reserved_at < %(until)s
    GROUP BY 1, 2, 3
    """
    params = {**scope, "all_queues": False, "queues": [QUEUE]}
    with connection.cursor() as cur:
        seconds, _ = _timed(lambda: (cur.execute(sql, params), cur.fetchall()))
    return seconds


def analytics(
    history: int, new: int, partitions: int, out: Callable[[str], None], *, keep: bool = False
) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from queue_app.spark.pipelines.queue_analytics import incremental_start, publish_hourly_stats, source_queries
    from queue_app.spark.registry import get_job
    from queue_app.spark.session import run_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers run this interpreter
    job = get_job("queue_analytics")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    cleanup(keep_history=keep)
    if keep and seeded_history() == history:
        out(f"reusing the {history:,} reservations of history a --keep run left (queue {QUEUE})")
    else:
        cleanup()
        out(f"seeding {history:,} reservations of history (queue {QUEUE}) ...")
        seed_s, _ = _timed(lambda: seed(history, now - dt.timedelta(days=7), dt.timedelta(days=7, hours=-2), out=out))
        out(f"  seeded in {seed_s:.1f} s")
    builder = SparkSession.builder.master(os.environ.get("SPARK_MASTER") or "local[2]")
    conf = {
        **run_conf("bench"),
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.ui.enabled": "false",
        "spark.driver.memory": os.environ.get("JOBSITE_BENCH_DRIVER_MEMORY", "2g"),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    jvm_s, spark = _timed(builder.getOrCreate)

    def run(raw: dict[str, Any]) -> tuple[float, Any]:
        values = job.validate(job.dump_params(job.prepare(job.validate(raw))))
        seconds, result = _timed(lambda: job.func(spark, values))
        with transaction.atomic():
            publish_hourly_stats(result.outputs, None)
        return seconds, result, values

    def postgres(result: Any, values: dict[str, Any]) -> float:
        """PostgreSQL over what the run read: its window, and the reservation ids it started from."""
        from_id = values.get("from_id") or 0
        as_of = dt.datetime.fromisoformat(values["as_of"])
        _, lo_id, _, until_id = incremental_start(from_id, as_of, values["until_id"])
        scope = {
            "since": dt.datetime.fromisoformat(result.metrics["since"]),
            "until": dt.datetime.fromisoformat(result.metrics["until"]),
            "lo_id": lo_id,
            "until_id": until_id,
        }
        return postgres_aggregate(source_queries(from_id)[0], scope)

    base = {"queues": QUEUE, "partitions": partitions}
    try:
        out("full rebuild, first run (JVM just started) ...")
        first_s, _, _ = run({**base, "full": True})
        out(f"  {first_s:.1f} s; second run (JIT and caches warm) ...")
        full_s, full, full_values = run({**base, "full": True})
        out(f"  {full_s:.1f} s; PostgreSQL's aggregate of the same ...")
        pg_full_s = postgres(full, full_values)
        out(f"  {pg_full_s:.1f} s; seeding {new:,} new reservations, then the incremental run ...")
        seed(new, now - dt.timedelta(hours=1, minutes=50), dt.timedelta(hours=1), worker=NEW)
        inc_s, inc, inc_values = run(base)
        out(f"  {inc_s:.1f} s; PostgreSQL's aggregate of the same ...")
        pg_inc_s = postgres(inc, inc_values)
    finally:
        spark.stop()
        cleanup(keep_history=keep)
    return {
        "reader": full.metrics["reader"],
        "partitions": partitions,
        # Spark's fixed costs, outside the figures below (which are a warm JVM's): starting the JVM and the
        # SparkSession, and the first full run (class loading, JIT) minus the second.
        "jvm_start_s": round(jvm_s, 3),
        "first_full_s": round(first_s, 3),
        "full": {
            "attempts": full.metrics["attempts"],
            "spark_s": round(full_s, 3),
            "postgres_s": round(pg_full_s, 3),
            "ratio": round(full_s / pg_full_s, 2),
        },
        "incremental": {
            "attempts": inc.metrics["attempts"],
            "spark_s": round(inc_s, 3),
            "postgres_s": round(pg_inc_s, 3),
            "ratio": round(inc_s / pg_inc_s, 2),
        },
    }


def startup(out: Callable[[str], None]) -> dict[str, Any]:
    """Bare spark-submit of a script vs the same script by path through jobsite's launcher."""
    from queue_app.spark.launcher import launch
    from queue_app.spark.scripts import ROOTS_ENV
    from queue_app.spark.session import spark_home

    with tempfile.TemporaryDirectory(prefix="spark-bench-") as root:
        script = os.path.join(root, "pi.py")
        with open(script, "w") as f:
            f.write(PI)
        env = {
            **os.environ,
            "SPARK_HOME": spark_home(),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        out("bare spark-submit ...")
        bare_s, _ = _timed(
            lambda: subprocess.run(
                [os.path.join(spark_home(), "bin", "spark-submit"), "--master", "local[2]", script, "20000"],
                env=env,
                capture_output=True,
                check=True,
            )
        )
        os.environ[ROOTS_ENV] = root
        first: list[float] = []
        t0 = time.perf_counter()
        out("the same script through jobsite's launcher ...")
        result = launch(
            "script",
            {"path": script, "args": json.dumps(["20000"])},
            "bench",
            master="local[2]",
            on_progress=lambda p: first.append(time.perf_counter() - t0) if p.get("tasks_total") else None,
        )
        total = time.perf_counter() - t0
    return {
        "bare_spark_submit_s": round(bare_s, 2),
        "jobsite_cold_s": round(total, 2),
        "jobsite_cold_first_task_s": round(first[0], 2) if first else None,
        "jobsite_outcome": result.outcome,
    }


def _first_task_and_total(job: str, params: dict[str, Any], run_id: str) -> dict[str, Any]:
    from queue_app.spark.launcher import launch

    first: list[float] = []
    setup: dict[str, Any] = {}
    t0 = time.perf_counter()
    result = launch(
        job,
        params,
        run_id,
        master="local[2]",
        on_progress=lambda p: first.append(time.perf_counter() - t0) if p.get("tasks_done") else None,
        on_start=lambda started: setup.update(started.get("setup_seconds") or {}),
    )
    return {
        "first_task_s": round(first[0], 2) if first else None,
        "total_s": round(time.perf_counter() - t0, 2),
        "outcome": result.outcome,
        "path": result.path,
        "spare_child": "standby" in setup,  # a light child started after the previous warm run took it
    }


def warm(out: Callable[[str], None], runs: int = 3, pause: float = 5.0) -> dict[str, Any]:
    """A registered function (demo_sleep, 2 tasks of 0 s) cold through spark-submit, then `runs` times through a
    Spark Connect server started here (its own start not counted, as a warm server is already up), `pause`
    seconds apart: trigger -> first task done, and total. The first warm run starts its light child; each later
    one takes the spare child its predecessor left ready."""
    import socket

    from queue_app.spark import connect, connect_health
    from queue_app.spark.connect_server import Supervisor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = connect.parse_url(f"sc://127.0.0.1:{s.getsockname()[1]}")
    params = {"tasks": 2, "seconds": 0}
    os.environ.pop(connect.ENV, None)
    out("a registered function, cold (spark-submit) ...")
    cold = _first_task_and_total("demo_sleep", params, "bench-cold")
    supervisor = Supervisor(url, master="local[2]", log=out)
    out(f"starting a Spark Connect server on {url} ...")
    supervisor.start()
    try:
        session = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            error, session = connect.probe(url, session)
            if not error:
                break
            time.sleep(0.5)
        connect_health.record(url, "local[2]", pid=supervisor.proc.pid, healthy=not error, error=error)
        os.environ[connect.ENV] = str(url)
        warm_runs = []
        for i in range(runs):
            if i:
                time.sleep(pause)  # a worker between two runs: the spare light child gets ready
            out(f"the same function through the warm server ({i + 1}/{runs}) ...")
            warm_runs.append(_first_task_and_total("demo_sleep", params, f"bench-warm-{i}"))
    finally:
        os.environ.pop(connect.ENV, None)
        supervisor.stop()
        from queue_app.spark.models import SparkConnectServer

        SparkConnectServer.objects.filter(url=str(url)).delete()
    best = min((r for r in warm_runs if r["first_task_s"] is not None), key=lambda r: r["total_s"], default=None)
    return {
        "cold": cold,
        "warm_runs": warm_runs,
        "first_task_ratio": round(cold["first_task_s"] / best["first_task_s"], 1)
        if best and cold["first_task_s"]
        else None,
    }
