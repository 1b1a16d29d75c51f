"""Spark jobs and the datasets they produce and consume (declared with `produces=`/`consumes=`, datasets/refs.py).
The datasets' side of a Spark run: register() puts its steps on the hooks a run publishes (spark/hooks.py),
from the datasets app's ready(); the Spark run names no dataset.

- jobsite.E106 (a system check): a job naming an unknown dataset, or a partition parameter it does not declare
  (or one an unpartitioned dataset cannot take, or none for a partitioned dataset it produces);
- run_partitions() (hook trigger_checks): the partitions a run will produce, when it is triggered (a partition
  that does not fit its dataset: SparkParamError, nothing queued);
- output_figures() (hook success_outputs) and record_outputs() (hook succeeded): when a run succeeds, one
  materialization per produced partition, written in the transaction that marks the run succeeded (runs._finish
  calls the hook inside it). Rows and bytes come from the run's
  event log (its tasks' output metrics) when the run produces one partition of one dataset; files (and bytes,
  when it produces several datasets, or several partitions in a batched backfill) are counted at the partition's
  location (data files only: not Spark's _SUCCESS or .crc files). A figure that cannot be known is null. What
  the program reported through jobsite/spark_report.py (script_report.py) replaces the rows and adds metadata.
- users(): the jobs producing and consuming each dataset (`dataset show`).
- consumed_unusable() and check_consumed() (hook trigger_checks), park_blocked() (hook start_checks): a run
  reading a partition whose latest materialization failed its blocking checks, or whose blocking checks still
  run (datasets/checks_run.py), may not start: the trigger is refused (DatasetBlocked), and a queued run meeting
  one when it starts is held (runs.spark_run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from django.core import checks

from ..engine import release
from ..engine.alias import atomic
from ..spark import eventlog, hooks, script_report
from ..spark.hooks import RunBlocked
from ..spark.registry import SparkJob, SparkParamError, all_jobs, code_jobs, stored_jobs
from . import checks_run, services
from .checks_run import Unusable, unusable
from .declarations import DatasetError, get_dataset
from .lineage import LineageGraph
from .locations import LocationError, dataset_roots
from .mappings import IDENTITY, mapping_of
from .partitions import PartitionError
from .refs import PartitionParamError, partition_keys, ref_problems


@checks.register("jobsite")
def job_datasets(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobsite.E106 for the jobs in code and settings."""
    errors = []
    for spark_job in code_jobs():
        names = [p.name for p in spark_job.params]
        for what, refs in (("produces", spark_job.produces), ("consumes", spark_job.consumes)):
            for problem in ref_problems(refs, names, produced=what == "produces"):
                errors.append(checks.Error(f"Spark job {spark_job.name!r} {what}: {problem}", id="jobsite.E106"))
    return errors


def run_partitions(spark_job: SparkJob, params: Mapping[str, Any]) -> dict[str, list[str]]:
    """{dataset: [partition keys]} a run of `spark_job` with the dumped `params` produces (several when the job
    takes a list of partitions in its `partitions_param`: a batched backfill); SparkParamError naming the
    parameter whose value does not fit (or the unknown dataset)."""
    listed = params.get(spark_job.partitions_param) if spark_job.partitions_param else None
    values = [v.strip() for v in str(listed).split(",") if v.strip()] if listed else [None]
    found: dict[str, list[str]] = {}
    for value in values:
        run_params = dict(params) if value is None else _with_partition(spark_job, params, value)
        try:
            keys = partition_keys(spark_job.produces, run_params)
        except PartitionParamError as exc:
            param = spark_job.partitions_param if value is not None else exc.param
            raise SparkParamError(spark_job.name, {param: exc.message}) from None
        except DatasetError as exc:  # a dataset no longer declared
            raise SparkParamError(spark_job.name, {"__all__": str(exc)}) from None
        for name, key in keys.items():
            if key not in found.setdefault(name, []):
                found[name].append(key)
    return found


def _with_partition(spark_job: SparkJob, params: Mapping[str, Any], value: str) -> dict[str, Any]:
    """`params` with each produced dataset's partition parameter set to `value` (one of a batch's list)."""
    return {**params, **{ref.param: value for ref in spark_job.produces if ref.param}}


class DatasetBlocked(RunBlocked):
    """A run that reads a partition whose latest materialization is not usable; `unusable` says which."""

    def __init__(self, job: str, found: list[Unusable]) -> None:
        self.unusable = found
        super().__init__(job, "; ".join(u.reason() for u in found))


def consumed_reads(spark_job: SparkJob, params: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(dataset, partition key) pairs a run with the dumped `params` reads; None: every partition (a partitioned
    dataset consumed without a parameter, or with a parameter left empty). An unknown dataset (E106 says so)
    or a value that is no partition of it names nothing."""
    reads: list[tuple[str, str | None]] = []
    for ref in spark_job.consumes:
        try:
            ds = get_dataset(ref.name)
            partitioned = ds.partitioning.describe() is not None
            value = params.get(ref.param) if ref.param is not None else None
            if ref.param is not None and len(ref.params) > 1:  # one parameter per dimension: day|region
                value = [params[p] for p in ref.params] if all(params.get(p) is not None for p in ref.params) else None
            if not partitioned:
                reads.append((ds.name, ds.partition_key(None)))
            else:
                reads.append((ds.name, ds.partitioning.key(value) if value is not None else None))
        except (DatasetError, PartitionError):
            continue
    return reads


def consumed_unusable(spark_job: SparkJob, params: Mapping[str, Any]) -> list[Unusable]:
    """The partitions a run reads whose latest materialization is not usable (checks pending or failed)."""
    return unusable(consumed_reads(spark_job, params))


def check_consumed(spark_job: SparkJob, params: Mapping[str, Any]) -> None:
    """DatasetBlocked when a run with `params` would read a partition that is not usable."""
    found = consumed_unusable(spark_job, params)
    if found:
        raise DatasetBlocked(spark_job.name, found)


def check_trigger(spark_job: SparkJob, params: Mapping[str, Any]) -> None:
    """When a run is triggered (hook trigger_checks): its partitions fit the datasets it produces, and the
    partitions it reads are usable (SparkParamError, DatasetBlocked)."""
    run_partitions(spark_job, params)
    check_consumed(spark_job, params)


def park_blocked(run: Any, spark_job: SparkJob, ctx: Any) -> str | None:
    """When a queued run's attempt begins (hook start_checks): None when it may start. A run reading a partition
    whose latest materialization's blocking checks failed or still run is parked: its item handed back to the
    queue (the attempt not spent) with a DatasetBlock row per partition, in one transaction; the transaction that
    makes the partition usable (its checks pass, a new materialization, an override) makes the item due again
    (datasets/checks_run.py). Returns why it is parked."""
    reads = consumed_reads(spark_job, run.params)
    found = checks_run.unusable(reads)
    if found:
        with atomic():
            # Read again under the materializations' locks, the rows written with their reasons: a release that
            # committed meanwhile is seen now (a new materialization's record committing later misses these rows:
            # the item checks again after checks_run.park_recheck()); a check result waits for this transaction,
            # then rewrites the reasons.
            found = checks_run.park(ctx.item_id, reads, spark_run_id=run.id)
            if found:
                release(ctx, delay=checks_run.park_recheck())
    if not found:
        checks_run.unpark(ctx.item_id)
        return None
    return "; ".join(u.reason() for u in found)


def output_figures(spark_job: SparkJob, params: Mapping[str, Any], run_id: int, app_id: str | None) -> list[dict]:
    """What a succeeded run of `spark_job` wrote: one entry per produced partition, with its figures (read
    outside the transaction that records them: the event log and the partition's files)."""
    if not spark_job.produces:
        return []
    keys = [(name, key) for name, listed in run_partitions(spark_job, params).items() for key in listed]
    written = _event_log_output(run_id, app_id) if len(keys) == 1 else None
    found = []
    for name, key in keys:
        (rows, size), files = written or (None, None), None
        ds = get_dataset(name)
        if ds.location.path:
            try:
                path = ds.location.resolve(key)
            except LocationError:
                path = None
            if path and os.path.exists(path):
                files, on_disk = services.stat_files(path, dataset_roots(), data_only=True)
                size = size if size is not None else on_disk
        found.append({"dataset": name, "partition": key, "rows": rows, "bytes": size, "files": files})
    script_report.merge(found, script_report.read(run_id), run_id, _partition_key)  # what the program reported
    return found


def _partition_key(name: str, partition: str) -> str | None:
    """A reported partition's canonical key in dataset `name`, None when it is not one (script_report.merge)."""
    try:
        return get_dataset(name).partition_key(partition)
    except DatasetError:
        return None


def _event_log_output(run_id: int, app_id: str | None) -> tuple[int, int] | None:
    """(records written, bytes written) over the run's successful tasks, from its event log."""
    log = eventlog.log_for(run_id, app_id) if app_id else None
    if log is None:
        return None
    try:
        _progress, metrics, _times = eventlog.summarize(log)
    except OSError:  # deleted since (a prune): the figures are unknown
        return None
    return metrics["output_records"], metrics["output_bytes"]


def record_outputs(outputs: list[dict], run_id: int, job: str) -> None:
    """Record each produced partition; called inside the transaction that marks run `run_id` succeeded. In
    (dataset, partition) order: each record locks its consumers' trigger state rows, and one order for every
    recorder keeps two runs producing the same datasets from locking them in opposite orders."""
    for out in sorted(outputs, key=lambda o: (o["dataset"], o["partition"])):
        services.record_materialization(
            out["dataset"],
            out["partition"],
            rows=out["rows"],
            bytes=out["bytes"],
            files=out["files"],
            metadata={**out.get("metadata", {}), "job": job},
            spark_run_id=run_id,
        )


def register() -> None:
    """Put the datasets' steps on a Spark run's hooks (the datasets app's ready())."""
    hooks.trigger_checks.register(check_trigger)
    hooks.start_checks.register(park_blocked)
    hooks.success_outputs.register(output_figures)
    hooks.succeeded.register(record_outputs)


def users() -> dict[str, dict[str, list[str]]]:
    """{dataset: {"producers": [job names], "consumers": [job names]}} from the jobs' declarations."""
    return _users_of(all_jobs())


def _users_of(jobs: list[SparkJob]) -> dict[str, dict[str, list[str]]]:
    found: dict[str, dict[str, list[str]]] = {}
    for spark_job in jobs:
        for what, refs in (("producers", spark_job.produces), ("consumers", spark_job.consumes)):
            for ref in refs:
                found.setdefault(ref.name, {"producers": [], "consumers": []})[what].append(spark_job.name)
        for ref, _label in _mapped(spark_job):  # a mapped trigger upstream is read too
            users = found.setdefault(ref.name, {"producers": [], "consumers": []})["consumers"]
            if spark_job.name not in users:
                users.append(spark_job.name)
    return found


def _mapped(spark_job: SparkJob) -> list[tuple[Any, str]]:
    """The job's trigger upstreams read through a mapping other than identity, with the mapping's label."""
    refs = spark_job.on_update.upstreams if getattr(spark_job, "on_update", None) else ()
    found = []
    for ref in refs:
        try:
            mapping = mapping_of(ref.mapping)
        except PartitionError:  # jobsite.E108 says so
            continue
        if mapping != IDENTITY:
            found.append((ref, mapping.label))
    return found


def mapping_labels(jobs: list[SparkJob]) -> dict[tuple[str, str], str]:
    """{(dataset, job): the mapping's label} for the lineage graph's edges."""
    return {(ref.name, job.name): label for job in jobs for ref, label in _mapped(job)}


_lineage: list[Any] = [None, None, None]  # the key, users and graph last built


def lineage() -> tuple[dict[str, dict[str, list[str]]], LineageGraph]:
    """users() and the LineageGraph of it, kept while the declarations are the same: the code's and settings'
    jobs the same objects (a registration replaces its SparkJob) and the stored scripts declaring the same
    datasets (read each time: a few rows). With 10,000 jobs, building both took most of a dataset page. The
    dict is shared: read it, never change it."""
    code = code_jobs()
    stored = stored_jobs()
    key = (
        tuple(map(id, code)),
        tuple((j.name, tuple(r.name for r in j.produces), tuple(r.name for r in j.consumes)) for j in stored),
    )
    kept_key, kept_users, kept_graph = _lineage
    if key == kept_key:
        return kept_users, kept_graph
    jobs = sorted([*code, *stored], key=lambda job: job.name)
    found = _users_of(jobs)
    graph = LineageGraph(found, mapping_labels(jobs))
    _lineage[:] = [key, found, graph]
    return found, graph
