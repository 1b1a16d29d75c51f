"""Spark fixtures, imported by tests/test_spark_*.py only (never from conftest.py), so a test run that selects
no Spark test never starts a JVM.

`spark` (a test module gets it by importing `spark_session`) is the one in-process SparkSession of the whole
test session: local[2], UI off, two shuffle partitions and a JVM tuned for start-up (C1 only, serial GC), with
the run defaults (UTC, the JDBC jar) a launched run gets.
"""

import os
import sys

import pytest

from tests.support.spark_jvm import FAST_JVM_FLAGS, RUN_SIZES

# C1 only and the serial GC: a JVM that starts fast, for short test runs (launched runs take it too).
FAST_JVM = {"spark.driver.extraJavaOptions": FAST_JVM_FLAGS}
TEST_CONF = {"spark.ui.enabled": "false", **RUN_SIZES, **FAST_JVM}


def require_spark() -> None:
    """Skip (with the reason) when pyspark or a Java runtime is missing."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
    from queue_app.spark.java import JavaNotFound, check_java

    try:
        check_java()
    except JavaNotFound as exc:
        pytest.skip(str(exc))


def require_jdbc_for_tcp() -> None:
    """Skip (with the reason) when the test database is reached over TCP, which Spark reads over JDBC, and the
    driver jar is missing (`manage.py test` installs it; plain `pytest` does not)."""
    from queue_app.spark.db import postgres_source
    from queue_app.spark.session import JDBC_JAR, jdbc_jar

    if not postgres_source().is_socket and jdbc_jar() is None:
        pytest.skip(f"{JDBC_JAR} is missing: apt-get install libpostgresql-jdbc-java (manage.py test does)")


@pytest.fixture(scope="session", name="spark")
def spark_session():
    require_spark()
    import logging

    from pyspark.sql import SparkSession

    from queue_app.spark.session import run_conf

    # Python workers must run this interpreter (the one with pyspark), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines outlive pytest's log capture
    builder = SparkSession.builder.master("local[2]")
    for key, value in {**run_conf("tests"), **TEST_CONF}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()


def seed_queue_history(since, *, items: int = 300, seed: int = 7) -> int:
    """Queue history around `since` (from 6 h before to 2 days after): items with 1-4 attempts ending done,
    dead (failed, timed out or lease expired), still running, or waiting for a retry, as the engine writes
    them (a retry moves the item's run_at; an expired lease does not). Returns the number of reservations."""
    import random
    from datetime import timedelta

    from queue_app.models import Queue, QueueItem, Reservation

    rng = random.Random(seed)
    tasks = {"default": ["email.send", "thumb.make"], "reports": ["report.build"]}
    Queue.objects.bulk_create([Queue(name=name) for name in tasks], ignore_conflicts=True)
    final_state = {"done": "done", "dead": "dead", "running": "reserved", "retry_pending": "ready"}
    plans = []
    for _ in range(items):
        queue = rng.choice(list(tasks))
        due = since + timedelta(seconds=rng.uniform(-6 * 3600, 48 * 3600))
        created = due - timedelta(seconds=rng.choice([0, 0, 30, 600]))
        attempts = rng.choices([1, 2, 3, 4], weights=[60, 20, 12, 8])[0]
        fate = rng.choices(list(final_state), weights=[70, 15, 5, 10])[0]
        run_at, attempt_rows = due, []
        for attempt in range(1, attempts + 1):
            reserved = due + timedelta(seconds=rng.expovariate(1 / 40))
            if attempt < attempts:
                outcome = rng.choices(["retry", "expired", "timed_out"], weights=[70, 15, 15])[0]
            else:
                outcome = {"done": "done", "running": None, "retry_pending": "retry"}.get(fate) or rng.choice(
                    ["dead", "timed_out", "expired"]
                )
            if outcome is None:
                finished = None
            elif outcome == "expired":
                finished = reserved + timedelta(seconds=60 + rng.uniform(0, 5))
            else:
                finished = reserved + timedelta(seconds=rng.expovariate(1 / 3))
            attempt_rows.append((attempt, reserved, finished, outcome))
            if outcome == "expired":
                due = reserved + timedelta(seconds=60)  # taken again after the lease; run_at stays
            elif outcome in ("retry", "timed_out") and not (attempt == attempts and fate == "dead"):
                due = finished + timedelta(seconds=rng.uniform(1, 600))  # backoff: the engine moves run_at
                run_at = due
        item = QueueItem(
            queue_id=queue,
            task=rng.choice(tasks[queue]),
            state=final_state[fate],
            run_at=run_at,
            visible_at=run_at,
            attempts=attempts,
            created_at=created,
            finished_at=attempt_rows[-1][2] if fate in ("done", "dead") else None,
        )
        plans.append((item, attempt_rows))
    QueueItem.objects.bulk_create([item for item, _ in plans])
    reservations = [
        Reservation(
            item=item,
            attempt=attempt,
            worker_id="seed",
            reserved_at=reserved,
            lease_expires_at=reserved + timedelta(seconds=60),
            heartbeat_at=reserved,
            finished_at=finished,
            outcome=outcome,
        )
        for item, rows in plans
        for attempt, reserved, finished, outcome in rows
    ]
    reservations.sort(key=lambda r: r.reserved_at)  # ids follow reserved_at, as the engine's leases make them
    Reservation.objects.bulk_create(reservations)
    by_item = {r.item_id: r for r in reservations}  # the last attempt of each item is its current reservation
    for item, _ in plans:
        item.reservation = by_item[item.id]
    QueueItem.objects.bulk_update([item for item, _ in plans], ["reservation"])
    return len(reservations)
