"""Spark jobs as consumers of data-aware triggers (datasets/triggers.py): a job declared with `on_update=` is
started for a partition by trigger_run (one SparkRun and its item, trigger "dataset") inside the transaction
that records its last upstream materialization. Registered as a consumer source when Django is ready
(datasets/apps.py), so every process that records materializations knows the jobs' triggers.

The partition goes to the job's parameter named by the on_update reference (on_update={"events": "day"}), else
the one its `consumes` or `produces` names for a partitioned dataset (one per dimension: "day|region"), as for a
workflow (triggers.declared_consumer); the system checks say when there is none.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..spark.models import SPARK_OPEN_STATES, SparkRun, SparkTrigger
from ..spark.registry import code_jobs
from ..spark.runs import trigger_run
from . import dynamic, triggers


def start_run(job_name: str, params: dict[str, str], requested_by: str) -> str:
    """One run of `job_name` with `params`, queued in the caller's transaction."""
    return f"spark_run:{trigger_run(job_name, params, trigger=SparkTrigger.DATASET, requested_by=requested_by).id}"


def spark_consumers() -> Iterator[triggers.Consumer]:
    """A consumer per Spark job in code or settings declared with on_update."""
    for job in code_jobs():
        if job.on_update is None:
            continue
        yield triggers.declared_consumer(
            "spark",
            job.name,
            job.on_update,
            start_run,
            params=[p.name for p in job.params],
            refs=(*job.consumes, *job.produces),
            produces=[ref.name for ref in job.produces],
            origin=f"Spark job {job.name!r}",
            atomic_start=True,  # trigger_run validates first, then writes in its own atomic block
        )


def open_runs(partition_set: str, keys: list[str]) -> list[str]:
    """The open runs (queued or running) of jobs that produce, consume or are triggered by a dataset of the
    dynamic set, whose parameters name one of `keys` (a value, or a part of a "day|customer" value)."""
    jobs = [
        job.name
        for job in code_jobs()
        if dynamic.uses_set(
            partition_set, (*job.produces, *job.consumes, *(job.on_update.upstreams if job.on_update else ()))
        )
    ]
    if not jobs:
        return []
    runs = SparkRun.objects.filter(job__in=jobs, state__in=SPARK_OPEN_STATES).only("id", "params")
    return [f"spark_run:{run.id}" for run in runs if dynamic.names_key(run.params, keys)]


triggers.add_source(spark_consumers)
dynamic.add_open_runs(open_runs)
