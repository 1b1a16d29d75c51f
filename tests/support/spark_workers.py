"""A worker on the spark queue (`spark_worker` fixture), its environment and SPARK_CONF_DIR, and a Spark run's row, its
end and its tasks running."""

import os

import pytest

from queue_app.spark.models import SparkRun
from tests.support.spark_archive import FAST_JVM_FLAGS, spark_conf_opts
from tests.support.waiting import wait_for

# The worker's Spark children: two local cores and a JVM tuned for start-up (as the in-process test session).
WORKER_ENV = {
    "SPARK_MASTER": "local[2]",
    "JAVA_TOOL_OPTIONS": FAST_JVM_FLAGS,
    "JOBSITE_SPARK_STOP_GRACE": "3",
}


# The test sizes of launched runs: two shuffle partitions instead of 200, so a small rollup is a few tasks, not
# hundreds. Given as the driver's system properties, not a SPARK_CONF_DIR: spark-submit puts that directory first
# on the driver's class path, and the suite's class archive then no longer fits it (tests/support/spark_archive.py).
RUN_SIZES = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}


def run_sizes_opts() -> str:
    """SPARK_SUBMIT_OPTS for a child whose Spark runs take the test sizes, after what this process has (the
    class archive)."""
    return " ".join(part for part in (os.environ.get("SPARK_SUBMIT_OPTS"), spark_conf_opts(RUN_SIZES)) if part)


def worker_env(**extra: str) -> dict[str, str]:
    """WORKER_ENV plus the test sizes of launched runs (RUN_SIZES)."""
    return {**WORKER_ENV, "SPARK_SUBMIT_OPTS": run_sizes_opts(), **extra}


@pytest.fixture
def spark_worker(spawn):
    def start(**env: str):
        return spawn(
            "run_worker",
            "--queues",
            "spark",
            "--concurrency",
            "1",
            "--poll-interval",
            "0.5",
            env=worker_env(**env),
        )

    return start


def row(run_id: int) -> SparkRun:
    return SparkRun.objects.get(id=run_id)


def final(run_id: int) -> SparkRun | None:
    run = row(run_id)
    return run if run.is_final else None


def tasks_running(run_id: int) -> SparkRun:
    return wait_for(
        lambda: (r := row(run_id)).state == "running" and r.progress.get("tasks_active") and r,
        300,  # a worker's boot, its lease and a JVM's start: over 120 s at load 15 with the suite in parallel
        what="the run's tasks to be running",
    )
