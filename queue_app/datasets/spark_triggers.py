"""Spark jobs as consumers of data-aware triggers (datasets/triggers.py): a job declared with `on_update=` is
started for a partition by trigger_run (one SparkRun and its item, trigger "dataset") inside the transaction
that records its last upstream materialization. Registered as a consumer source when Django is ready
(datasets/apps.py), so every process that records materializations knows the jobs' triggers.

The partition goes to the job's parameter named by the on_update reference (on_update={"events": "day"}), else
the one its `consumes` or `produces` names for a partitioned dataset; the system checks say when there is none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..spark.models import SPARK_OPEN_STATES, SparkRun, SparkTrigger
from ..spark.registry import SparkJob, code_jobs
from ..spark.runs import trigger_run
from . import dynamic, triggers
from .declarations import DatasetError, get_dataset


def partition_param(job: SparkJob) -> str | None:
    """The job's parameter taking the partition of its trigger's upstreams (None: it takes none)."""
    assert job.on_update is not None
    for ref in job.on_update.upstreams:
        if ref.param:
            return ref.param
    for ref in (*job.consumes, *job.produces):
        try:
            partitioned = get_dataset(ref.name).partitioning.describe() is not None
        except DatasetError:
            continue
        if ref.param and partitioned:
            return ref.param
    return None


def start_run(job_name: str, param: str | None, partition: str, upstream: Mapping[str, int]) -> list[str]:
    """One run of `job_name` for `partition`, queued in the caller's transaction."""
    params = {param: partition} if param and partition else {}
    if param and partition and "|" in param:  # one parameter per dimension ("day|region" takes "2026-11-30|eu")
        params = dict(zip(param.split("|"), partition.split("|"), strict=False))
    requested_by = ", ".join(f"{name} #{mid}" for name, mid in sorted(upstream.items()))  # "events #12, ..."
    run = trigger_run(job_name, params, trigger=SparkTrigger.DATASET, requested_by=requested_by)
    return [f"spark_run:{run.id}"]


def spark_consumers() -> Iterator[triggers.Consumer]:
    """A consumer per Spark job in code or settings declared with on_update."""
    for job in code_jobs():
        if job.on_update is None:
            continue
        param = partition_param(job)

        def start(partition: str, upstream: Mapping[str, int], name: str = job.name, p: str | None = param) -> list:
            return start_run(name, p, partition, upstream)

        yield triggers.Consumer(
            key=f"spark:{job.name}",
            trigger=job.on_update,
            start=start,
            param=param,
            params=tuple(p.name for p in job.params),
            produces=tuple(ref.name for ref in job.produces),
            origin=f"Spark job {job.name!r}",
            atomic_start=True,  # trigger_run validates first, then writes in its own atomic block
        )


def open_runs(partition_set: str, keys: list[str]) -> list[str]:
    """The open runs (queued or running) of jobs that produce, consume or are triggered by a dataset of the
    dynamic set, whose parameters name one of `keys` (a value, or a part of a "day|customer" value)."""
    jobs = []
    for job in code_jobs():
        refs = (*job.produces, *job.consumes, *(job.on_update.upstreams if job.on_update else ()))
        for ref in refs:
            try:
                if any(p.name == partition_set for _n, p in dynamic.sets_of(get_dataset(ref.name))):
                    jobs.append(job.name)
                    break
            except DatasetError:
                continue
    if not jobs:
        return []
    wanted, found = set(keys), []
    for run in SparkRun.objects.filter(job__in=jobs, state__in=SPARK_OPEN_STATES).only("id", "params"):
        values = {part for v in (run.params or {}).values() if isinstance(v, str) for part in v.split("|")}
        if values & wanted:
            found.append(f"spark_run:{run.id}")
    return found


triggers.add_source(spark_consumers)
dynamic.add_open_runs(open_runs)
