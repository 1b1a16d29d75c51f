"""The shipped pipelines, run in-process on the session's SparkSession against the test PostgreSQL.

Queue analytics is checked against the same figures computed by PostgreSQL itself (percentile_cont, count
FILTER) over the same rows: the SQL below is the executable form of the definitions in queue_analytics.py.
"""

import csv
import dataclasses
import datetime as dt
import os
from collections import defaultdict

import pytest

from queue_app.spark import db as spark_db
from queue_app.spark.db import postgres_source
from queue_app.spark.pipelines import file_rollup, queue_analytics
from queue_app.spark.registry import get_job
from tests.support.spark_analytics import EXPECTED_SQL
from tests.support.spark_fixtures import require_jdbc_for_tcp, seed_queue_history, spark_session  # noqa: F401  (`spark`)

pytestmark = pytest.mark.spark

SINCE = dt.datetime(2025, 3, 10, tzinfo=dt.UTC)
UNTIL = SINCE + dt.timedelta(days=2)


def expected_stats(queues=None):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            EXPECTED_SQL, {"since": SINCE, "until": UNTIL, "all_queues": not queues, "queues": list(queues or [])}
        )
        result = {}
        for queue, task, hour, processed, failed, dead, retries, wait, run in cursor.fetchall():
            wait, run = wait or [None] * 3, run or [None] * 3
            result[(queue, task, hour.astimezone(dt.UTC).isoformat())] = {
                "processed": processed,
                "failed": failed,
                "dead": dead,
                "retries": retries,
                **{f"wait_p{p}": v for p, v in zip((50, 95, 99), wait, strict=True)},
                **{f"run_p{p}": v for p, v in zip((50, 95, 99), run, strict=True)},
            }
    return result


def run_job(spark, name, raw):
    job = get_job(name)
    return job.func(spark, job.validate(raw))


def assert_same_stats(rows, expected):
    actual = {(r["queue"], r["task"], r["hour"]): {k: r[k] for k in queue_analytics.STAT_COLUMNS} for r in rows}
    assert actual.keys() == expected.keys()
    for key, want in expected.items():
        for column, value in want.items():
            got = actual[key][column]
            assert got == (value if value is None else pytest.approx(value, rel=1e-9, abs=1e-6)), (key, column)


@pytest.fixture
def queue_history(transactional_db):
    """Committed history (Spark reads over its own connections) and its reservation count."""
    return seed_queue_history(SINCE)


def analytics_params(**extra):
    return {"since": SINCE.date().isoformat(), "until": UNTIL.date().isoformat(), **extra}


def test_queue_analytics_matches_postgres_over_jdbc(spark, queue_history, db_proxy, monkeypatch):
    source = postgres_source()
    if source.is_socket:  # the embedded server: JDBC speaks TCP only, so it reads through a TCP proxy to it
        tcp = dataclasses.replace(source, host="127.0.0.1", port=db_proxy.port)
        monkeypatch.setattr(spark_db, "postgres_source", lambda alias="default": tcp)
    require_jdbc_for_tcp()
    result = run_job(spark, "queue_analytics", analytics_params(reader="jdbc", partitions=3))
    expected = expected_stats()
    assert result.metrics["reader"] == "jdbc"
    assert len(expected) > 40  # several queues, tasks and hours, or the comparison proves little
    assert_same_stats(result.outputs["rows"], expected)
    assert result.metrics["attempts"] < queue_history  # history outside the window was read but not counted


def test_queue_analytics_matches_postgres_over_psycopg_reader(spark, queue_history):
    result = run_job(spark, "queue_analytics", analytics_params(reader="psycopg", queues="reports"))
    assert result.metrics["reader"] == "psycopg"
    assert {r["queue"] for r in result.outputs["rows"]} == {"reports"}
    assert result.outputs["window"] == {"since": SINCE.isoformat(), "until": UNTIL.isoformat(), "queues": ["reports"]}
    assert_same_stats(result.outputs["rows"], expected_stats(queues=["reports"]))


def _write_day(directory, day, rows):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"events-{day}.csv"), "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(file_rollup.SAMPLE_COLUMNS)
        writer.writerows(rows)


def read_rollup(spark, path):
    """{(day, region, product): (rows, sum_quantity, sum_amount)} of a rollup output."""
    return {
        (r["event_date"].isoformat(), r["region"], r["product"]): (r["rows"], r["sum_quantity"], r["sum_amount"])
        for r in spark.read.parquet(path).collect()
    }


def expected_rollup(input_dir):
    totals = defaultdict(lambda: [0, 0.0, 0.0])
    for name in os.listdir(input_dir):
        with open(os.path.join(input_dir, name)) as f:
            for row in csv.DictReader(f):
                t = totals[(row["event_date"], row["region"], row["product"])]
                t[0] += 1
                t[1] += float(row["quantity"])
                t[2] += float(row["amount"])
    return totals


def assert_rollup(actual, expected):
    assert actual.keys() == expected.keys()
    for key, (rows, quantity, amount) in expected.items():
        assert actual[key] == (rows, pytest.approx(quantity), pytest.approx(amount)), key


def test_file_rollup_rerun_replaces_only_the_days_it_read(spark, tmp_path):
    full, out = tmp_path / "in", tmp_path / "out"
    file_rollup.write_sample_input(str(full), rows=900, days=3, start=dt.date(2025, 1, 1), seed=1)
    params = {"input_dir": str(full), "output_dir": str(out)}

    first = run_job(spark, "file_rollup", params)
    assert first["days"] == ["2025-01-01", "2025-01-02", "2025-01-03"]
    assert first["input_rows"] == 900 and first["rows_without_date"] == 0
    assert_rollup(read_rollup(spark, str(out)), expected_rollup(full))

    run_job(spark, "file_rollup", params)  # a re-delivered run: same output, nothing doubled
    assert_rollup(read_rollup(spark, str(out)), expected_rollup(full))
    untouched = {d: sorted(os.listdir(out / f"event_date={d}")) for d in ("2025-01-01", "2025-01-03")}

    # Day 2 again, from corrected input: that day is replaced, days 1 and 3 are left exactly as they were.
    fix = tmp_path / "fix"
    _write_day(fix, "2025-01-02", [("2025-01-02", "north", "p01", 1, 2, 10.5), ("2025-01-02", "north", "p01", 1, 3, 1)])
    again = run_job(spark, "file_rollup", {"input_dir": str(fix), "output_dir": str(out)})
    assert again["days"] == ["2025-01-02"] and again["output_rows"] == 1
    result = read_rollup(spark, str(out))
    assert {k: v for k, v in result.items() if k[0] == "2025-01-02"} == {("2025-01-02", "north", "p01"): (2, 5.0, 11.5)}
    others = {k: v for k, v in expected_rollup(full).items() if k[0] != "2025-01-02"}
    assert_rollup({k: v for k, v in result.items() if k[0] != "2025-01-02"}, others)
    assert {d: sorted(os.listdir(out / f"event_date={d}")) for d in untouched} == untouched


def test_file_rollup_reads_json_lines_and_one_day(spark, tmp_path):
    src, out = tmp_path / "json", tmp_path / "out"
    file_rollup.write_sample_input(str(src), rows=300, days=3, fmt="json", start=dt.date(2025, 2, 1), seed=2)
    metrics = run_job(
        spark, "file_rollup", {"input_dir": str(src), "output_dir": str(out), "format": "json", "day": "2025-02-02"}
    )
    assert metrics["days"] == ["2025-02-02"] and metrics["input_rows"] == 100
    assert [name for name in os.listdir(out) if not name.startswith(("_", "."))] == ["event_date=2025-02-02"]


def test_file_rollup_names_missing_columns(spark, tmp_path):
    _write_day(tmp_path / "in", "2025-01-01", [("2025-01-01", "north", "p01", 1, 2, 10.5)])
    with pytest.raises(ValueError, match=r"input has no column\(s\) colour; it has: event_date, region"):
        run_job(
            spark,
            "file_rollup",
            {"input_dir": str(tmp_path / "in"), "output_dir": str(tmp_path / "o"), "keys": "colour"},
        )
