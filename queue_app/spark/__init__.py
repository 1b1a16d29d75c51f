"""The Spark control plane: registered jobs (`@spark_job`), their parameters, and runs launched as their own
`spark-submit` child process with progress, cancel and timeout (see launcher.py and DESIGN.md).

The package itself holds only what a job's author imports (the registry's API): importing it imports neither
pyspark nor the launcher (so no module of the package imports itself back through it).
Launching is `queue_app.spark.launcher.launch`; runs as queue work are `queue_app.spark.runs`.
"""

from queue_app.spark.registry import (
    JobResult,
    Param,
    SparkJob,
    SparkJobError,
    SparkParamError,
    UnknownSparkJob,
    all_jobs,
    get_job,
    spark_job,
    validate,
)

__all__ = [
    "JobResult",
    "Param",
    "SparkJob",
    "SparkJobError",
    "SparkParamError",
    "UnknownSparkJob",
    "all_jobs",
    "get_job",
    "spark_job",
    "validate",
]
