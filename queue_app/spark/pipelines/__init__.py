"""The Spark jobs jobsite ships; importing this package registers them (see registry.autodiscover())."""

from queue_app.spark.pipelines import demo, file_rollup, queue_analytics

__all__ = ["demo", "file_rollup", "queue_analytics"]
