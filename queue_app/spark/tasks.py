"""The Spark app's tasks, found by the task registry because the app is installed: `queue_app.spark_run` (one
run as queue work, runs.py)."""

from .runs import spark_run  # noqa: F401  registers queue_app.spark_run
