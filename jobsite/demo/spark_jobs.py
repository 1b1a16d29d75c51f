"""The demo's Spark jobs (the Spark job registry imports every installed app's spark_jobs.py)."""

from . import data, spark_demo  # noqa: F401  register demo, demo_rollup and demo_analytics
