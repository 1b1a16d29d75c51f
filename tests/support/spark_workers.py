"""A worker on the spark queue (`spark_worker` fixture), its environment, and a Spark run's row, its end and its tasks
running."""

import pytest

from queue_app.spark.models import SparkRun
from tests.support.spark_jvm import FAST_JVM_FLAGS
from tests.support.waiting import wait_for

# The worker's Spark children: two local cores and a JVM tuned for start-up (as the in-process test session).
WORKER_ENV = {
    "SPARK_MASTER": "local[2]",
    "JAVA_TOOL_OPTIONS": FAST_JVM_FLAGS,
    "JOBSITE_SPARK_STOP_GRACE": "3",
}


def worker_env(**extra: str) -> dict[str, str]:
    """WORKER_ENV and `extra`. The test sizes of launched runs come with this process's SPARK_SUBMIT_OPTS
    (tests/support/spark_jvm.py)."""
    return {**WORKER_ENV, **extra}


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
