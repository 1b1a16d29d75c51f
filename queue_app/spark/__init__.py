"""The Spark control plane: registered jobs (`@spark_job`), their parameters, and runs launched as their own
`spark-submit` child process with progress, cancel and timeout (see launcher.py and DESIGN.md).

Importing this package does not import pyspark; only the child process and the pipelines' job bodies do.
"""

from queue_app.spark.launcher import LaunchResult, launch
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
    "LaunchResult",
    "Param",
    "SparkJob",
    "SparkJobError",
    "SparkParamError",
    "UnknownSparkJob",
    "all_jobs",
    "get_job",
    "launch",
    "spark_job",
    "validate",
]
