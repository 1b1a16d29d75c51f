"""A demo job for the dashboard and the launcher's tests: tasks that sleep, so progress and cancel can be seen."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from queue_app.spark.registry import Param, spark_job


@spark_job(
    "demo_sleep",
    description="Demo: N tasks that each sleep a while; watch progress, try cancel.",
    params=[
        Param("tasks", "int", default=8, min=1, max=10_000, help="How many tasks."),
        Param("seconds", "float", default=1.0, min=0, max=3600, help="How long each task sleeps."),
        Param("fail", "bool", default=False, help="Raise after the tasks finish (to see a failed run)."),
    ],
)
def demo_sleep(spark, params: Mapping[str, Any]) -> dict[str, Any]:
    seconds = params["seconds"]

    def work(i: int) -> int:
        time.sleep(seconds)
        return i

    tasks = params["tasks"]
    if type(spark).__module__.startswith("pyspark.sql.connect"):  # a warm run: no SparkContext, a Python UDF
        from pyspark.sql import functions as F

        slow = F.udf(work, "long")
        rows = spark.range(0, tasks, 1, numPartitions=tasks).select(slow("id").alias("v"))
        total = rows.agg(F.sum("v")).first()[0]
    else:
        total = spark.sparkContext.parallelize(range(tasks), tasks).map(work).sum()
    if params["fail"]:
        raise RuntimeError("demo_sleep failed on purpose (fail=true)")
    return {"tasks": tasks, "sum": total}
