"""Spark jobs and scripts (code and settings) as producers of their datasets (datasets/producers.py): a dataset
declared with `trigger_producer_when_stale=True` that goes stale starts the job that declares it in `produces`,
one run for the wanted partition (its partition parameter set to the key; trigger "dataset"), queued in the
transaction that records the stale episode. Registered when Django is ready (apps.py)."""

from __future__ import annotations

from collections.abc import Iterator

from queue_app.datasets import producers

from .models import SparkTrigger
from .registry import code_jobs
from .runs import trigger_run


def start_run(job_name: str, param: str | None, partition: str, reason: str) -> list[str]:
    """One run of `job_name` for `partition`, queued in the caller's transaction."""
    params = {param: partition} if param and partition else {}
    run = trigger_run(job_name, params, trigger=SparkTrigger.DATASET, requested_by=reason[:150])
    return [f"spark_run:{run.id}"]


def spark_producers() -> Iterator[producers.Producer]:
    """A producer per (job in code or settings, dataset it produces)."""
    for job in code_jobs():
        for ref in job.produces:

            def start(partition: str, reason: str, name: str = job.name, p: str | None = ref.param) -> list[str]:
                return start_run(name, p, partition, reason)

            yield producers.Producer(f"spark:{job.name}", ref.name, start, origin=f"Spark job {job.name!r}")


producers.add_source(spark_producers)
