"""The Spark jobs jobsite ships; importing this package registers them (the `SPARK_JOB_MODULES`
setting names this package; registry.autodiscover() imports it, and it imports the registry, never the reverse)."""

from queue_app.spark.pipelines import file_rollup, queue_analytics

__all__ = ["file_rollup", "queue_analytics"]
