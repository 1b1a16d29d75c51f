"""A worker on the spark queue (`spark_worker` fixture), its environment and SPARK_CONF_DIR, and a Spark run's row, its
end and its tasks running."""

from pathlib import Path

import pytest

from queue_app.spark.models import SparkRun
from tests.support.spark_fixtures import TEST_CONF
from tests.support.waiting import wait_for

# The worker's Spark children: two local cores and a JVM tuned for start-up (as the in-process test session).
WORKER_ENV = {
    "SPARK_MASTER": "local[2]",
    "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "JOBSITE_SPARK_STOP_GRACE": "3",
}


def worker_env(conf_dir: Path, **extra: str) -> dict[str, str]:
    """WORKER_ENV plus a SPARK_CONF_DIR whose spark-defaults.conf gives launched runs the test sizes (two
    shuffle partitions instead of 200: a small rollup is then a few tasks, not hundreds)."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{key} {value}\n" for key, value in TEST_CONF.items() if key != "spark.ui.enabled")
    )
    return {**WORKER_ENV, "SPARK_CONF_DIR": str(conf_dir), **extra}


@pytest.fixture
def spark_worker(spawn, tmp_path_factory):
    conf_dir = tmp_path_factory.mktemp("spark-conf")

    def start(**env: str):
        return spawn(
            "run_worker",
            "--queues",
            "spark",
            "--concurrency",
            "1",
            "--poll-interval",
            "0.5",
            env=worker_env(conf_dir, **env),
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
