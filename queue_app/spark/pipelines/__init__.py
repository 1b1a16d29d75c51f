"""The Spark jobs jobsite ships; importing this package registers them (the `SPARK_JOB_MODULES`
setting names this package; registry.autodiscover() imports it, and it imports the registry, never the reverse)."""

from queue_app.spark.pipelines import (
    demo,
    demo_data,  # the demo's datasets, and file_rollup and queue_analytics again under its names
    file_rollup,
    queue_analytics,
)

__all__ = ["demo", "demo_data", "file_rollup", "queue_analytics"]
