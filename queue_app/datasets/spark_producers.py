"""Spark jobs and scripts (code and settings) as producers of their datasets (datasets/producers.py): a dataset
declared with `trigger_producer_when_stale=True` that goes stale starts the job that declares it in `produces`,
one run for the wanted partition (its partition parameter set to the key, the dataset's declared params added:
datasets/producer_params.py; trigger "dataset"), queued in the transaction that records the stale episode.
Registered when Django is ready (datasets/apps.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..spark.models import SparkTrigger
from ..spark.registry import code_jobs
from ..spark.runs import trigger_run
from . import producers
from .declarations import get_dataset
from .producer_params import producer_params


def start_run(
    job_name: str, dataset: str, param: str | None, partition: str, reason: str, given: Mapping[str, Any] | None = None
) -> list[str]:
    """One run of `job_name` for `partition` of `dataset`, queued in the caller's transaction."""
    params = producer_params(get_dataset(dataset), partition, param, given)
    run = trigger_run(job_name, params, trigger=SparkTrigger.DATASET, requested_by=reason[:150])
    return [f"spark_run:{run.id}"]


def spark_producers() -> Iterator[producers.Producer]:
    """A producer per (job in code or settings, dataset it produces)."""
    for job in code_jobs():
        for ref in job.produces:

            def start(partition: str, reason: str, params=None, name=job.name, ds=ref.name, p=ref.param) -> list[str]:
                return start_run(name, ds, p, partition, reason, params)

            yield producers.Producer(f"spark:{job.name}", ref.name, start, origin=f"Spark job {job.name!r}")


producers.add_source(spark_producers)
