"""Backfill by data: materialize partitions of a dataset by running the Spark job that produces it, one service
for the CLI (`dataset materialize`) and code.

    result = materialize("daily_revenue", start="2026-11-01", end="2026-11-07", missing_only=True)
    # {"dataset": "daily_revenue", "partitions": [...], "runs": [run ids], "state": "queued"}
    result = wait(result, timeout=3600)   # "succeeded" when every run did and its blocking checks passed

The partitions are one (`partition`), a range (`start`..`end`, both included, in the dataset's partitioning), or
the only one of an unpartitioned dataset; `missing_only` keeps those never materialized or whose latest
materialization failed its blocking checks. The producer is the one
Spark job (code, settings or a stored script) that declares the dataset in `produces` with a partition parameter;
each partition is one run (trigger_run), or up to N in one run for a job declared with backfill_batch=N (the
list comma-separated in its `partitions_param`), all queued in one transaction or none (a bad
partition, no producer, or a run refused: DatasetError, nothing queued). The job's concurrency policy (policy.py)
spaces the runs; each succeeded run records its materialization, which moves the dataset's own consumers.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connection, transaction

from queue_app.datasets.declarations import DatasetError, get_dataset
from queue_app.datasets.models import CheckState, Materialization
from queue_app.datasets.partitions import PartitionError
from queue_app.datasets.sql import MATERIALIZED_KEYS

from .models import SPARK_FINAL_STATES, SparkRun, SparkRunState, SparkTrigger
from .registry import SparkJob, SparkJobError, all_jobs
from .runs import trigger_run

MAX_PARTITIONS = 1000  # partitions one call may queue runs for


def producer_of(name: str) -> tuple[SparkJob, str | None]:
    """The Spark job producing dataset `name` and its parameter naming the partition; DatasetError when none or
    several do."""
    found = [(job, ref.param) for job in all_jobs() for ref in job.produces if ref.name == name]
    if not found:
        raise DatasetError(f"dataset {name!r}: no Spark job or script produces it (declare produces=)")
    if len(found) > 1:
        names = ", ".join(job.name for job, _ in found)
        raise DatasetError(f"dataset {name!r} is produced by several jobs ({names}): run the one you mean")
    return found[0]


def partitions_of(name: str, partition: Any = None, start: Any = None, end: Any = None) -> list[str]:
    ds = get_dataset(name)
    if partition is not None and (start is not None or end is not None):
        raise DatasetError("give a partition or a range (--from/--to), not both")
    if partition is not None:
        return [ds.partition_key(partition)]
    if start is None and end is None:
        if ds.partitioning.describe() is not None:
            raise DatasetError(f"dataset {name!r} is partitioned: give --partition or --from and --to")
        return [""]
    if start is None or end is None:
        raise DatasetError("a range needs both --from and --to")
    try:
        keys = ds.partitioning.keys(start, end)
    except PartitionError as exc:
        raise DatasetError(f"dataset {name!r}: {exc}") from None
    if not keys:
        raise DatasetError(f"the range {start}..{end} holds no partition of dataset {name!r}")
    if len(keys) > MAX_PARTITIONS:
        raise DatasetError(f"the range holds {len(keys)} partitions; at most {MAX_PARTITIONS} at once")
    return keys


def materialize(
    name: str,
    *,
    partition: Any = None,
    start: Any = None,
    end: Any = None,
    missing_only: bool = False,
    requested_by: str = "",
    trigger: str = SparkTrigger.CLI,
) -> dict[str, Any]:
    """Queue one run of the dataset's producer per partition (see the module); returns {"dataset",
    "partitions", "runs", "state"} with state "queued", or "nothing to do" when every partition is there."""
    keys = partitions_of(name, partition, start, end)
    job, param = producer_of(name)
    if missing_only:
        with connection.cursor() as cursor:
            cursor.execute(MATERIALIZED_KEYS, [name, keys])
            there = {row[0] for row in cursor.fetchall()}
        keys = [k for k in keys if k not in there]
    runs = []
    batch = job.backfill_batch if param else 1
    try:
        with transaction.atomic():
            for at in range(0, len(keys), batch):
                chunk = keys[at : at + batch]
                params = {param: chunk[0]} if param and chunk[0] else {}
                if len(chunk) > 1:  # the job's backfill policy: several partitions in one run
                    params[job.partitions_param] = ",".join(chunk)
                run = trigger_run(job.name, params, trigger=trigger, requested_by=requested_by or f"materialize {name}")
                runs.append(run.id)
    except SparkJobError as exc:
        raise DatasetError(f"dataset {name!r}: {exc}; nothing queued") from None
    return {"dataset": name, "partitions": keys, "runs": runs, "state": "queued" if runs else "nothing to do"}


def wait(result: dict[str, Any], *, timeout: float | None = None, poll: float = 0.5) -> dict[str, Any]:
    """Follow `result`'s runs to their end: state "succeeded" when every run succeeded and no materialization of
    the dataset they recorded has blocking checks failed (pending ones are waited for), "failed" when a run ended
    otherwise or a blocking check failed, "timed out" when `timeout` passed first ("nothing to do" stays)."""
    if not result["runs"]:
        return result
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        states = dict(SparkRun.objects.filter(id__in=result["runs"]).values_list("id", "state"))
        if all(states.get(run_id) in SPARK_FINAL_STATES for run_id in result["runs"]):
            if not all(states[run_id] == SparkRunState.SUCCEEDED for run_id in result["runs"]):
                return {**result, "state": "failed"}
            recorded = Materialization.objects.filter(  # the materialization_partition index, then the runs
                dataset=result["dataset"], partition__in=result["partitions"], spark_run_id__in=result["runs"]
            )
            checks = set(recorded.values_list("checks", flat=True))
            if CheckState.FAILED in checks:
                return {**result, "state": "failed"}
            if CheckState.PENDING not in checks:
                return {**result, "state": "succeeded"}
        if deadline is not None and time.monotonic() >= deadline:
            return {**result, "state": "timed out"}
        time.sleep(poll)
