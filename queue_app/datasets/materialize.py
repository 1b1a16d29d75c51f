"""Backfill by data: materialize partitions of a dataset by running its producer (the Spark job or script, or the
task, that declares it in `produces`), one service for the CLI (`dataset materialize`), the admin and code.

    result = materialize("daily_revenue", start="2026-11-01", end="2026-11-07", missing_only=True,
                         params={"output_dir": "/data/out"})
    # {"dataset": "daily_revenue", "partitions": [...], "runs": [run ids], "items": [], "state": "queued"}
    result = wait(result, timeout=3600)   # "succeeded" when every run did and its blocking checks passed

The partitions are one (`partition`), a range (`start`..`end`, both included, in the dataset's partitioning), or
the only one of an unpartitioned dataset; `missing_only` keeps those never materialized or whose latest
materialization failed its blocking checks. The producer is the one Spark job (code, settings or a stored
script) that declares the dataset in `produces` with a partition parameter, or the one task declared with
`@job(produces=...)` or `producer_task` (datasets/producers.py); several: DatasetError naming them. Each start
gets the partition, the dataset's declared params and the caller's `params` (datasets/producer_params.py, the
later winning). A Spark producer: one run a partition (trigger_run), or up to N in one run for a job declared with
backfill_batch=N (the list comma-separated in its `partitions_param`); a task: one item a partition (payload
{"dataset", "partition", "params", "reason"}). All are queued in one transaction or none (a bad partition, no
producer, bad params or a run refused: DatasetError, nothing queued). The job's concurrency policy (policy.py)
spaces the runs; each succeeded run or item records its materialization, which moves the dataset's own consumers.
"""

from __future__ import annotations

import time
from typing import Any

from django.db.models import Q

from queue_app.engine.errors import InvalidEnqueue
from queue_app.models import ItemState, QueueItem
from queue_app.registry import UnknownTask

from ..engine.alias import atomic, connection
from ..spark.models import SPARK_FINAL_STATES, SparkRun, SparkRunState, SparkTrigger
from ..spark.registry import SparkJob, SparkJobError, all_jobs
from ..spark.runs import trigger_run
from .declarations import DatasetError, get_dataset
from .models import CheckState, Materialization
from .partitions import MultiPartitions, PartitionError
from .producer_params import producer_params
from .producers import Producer, producers_of
from .sql import MATERIALIZED_KEYS

MAX_PARTITIONS = 1000  # partitions one call may queue runs for
ITEM_FINAL_STATES = (ItemState.DONE, ItemState.DEAD, ItemState.CANCELLED)


def producer_of(name: str) -> tuple[SparkJob, str | None] | Producer:
    """What produces dataset `name`: a Spark job and its parameter naming the partition, or a task's Producer;
    DatasetError when none or several do."""
    found: list[Any] = [(job, ref.param) for job in all_jobs() for ref in job.produces if ref.name == name]
    found += [p for p in producers_of(name) if p.key.startswith("task:")]
    if not found:
        raise DatasetError(
            f"dataset {name!r}: nothing produces it (declare produces= on a Spark job, a script or a task)"
        )
    if len(found) > 1:
        names = ", ".join(f[0].name if isinstance(f, tuple) else f.key for f in found)
        raise DatasetError(f"dataset {name!r} is produced by several jobs ({names}): run the one you mean")
    return found[0]


def partitions_of(name: str, partition: Any = None, start: Any = None, end: Any = None) -> list[str]:
    ds = get_dataset(name)
    if partition is not None and (start is not None or end is not None):
        raise DatasetError("give a partition or a range (--from/--to), not both")
    if isinstance(partition, str) and "*" in partition:  # "2026-11-30|*": every key of the other dimension
        start = end = partition
    elif partition is not None:
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
    params: dict[str, Any] | None = None,
    requested_by: str = "",
    trigger: str = SparkTrigger.CLI,
) -> dict[str, Any]:
    """Queue one run (or item) of the dataset's producer per partition (see the module); returns {"dataset",
    "partitions", "runs", "items", "state"} with state "queued", or "nothing to do" when every partition is
    there."""
    keys = partitions_of(name, partition, start, end)
    producer = producer_of(name)
    if missing_only:
        with connection.cursor() as cursor:
            cursor.execute(MATERIALIZED_KEYS, [name, keys])
            there = {row[0] for row in cursor.fetchall()}
        keys = [k for k in keys if k not in there]
    ds = get_dataset(name)
    runs: list[int] = []
    items: list[int] = []
    reason = requested_by or f"materialize {name}"
    try:
        with atomic():
            if isinstance(producer, Producer):
                for key in keys:
                    items += [int(ref.split(":")[1]) for ref in producer.start(key, reason, params)]
            else:
                job, param = producer
                batch = job.backfill_batch if param else 1
                for at in range(0, len(keys), batch):
                    chunk = keys[at : at + batch]
                    given = producer_params(ds, chunk[0], param, params)
                    if len(chunk) > 1:  # the job's backfill policy: several partitions in one run
                        given[job.partitions_param] = ",".join(chunk)
                    runs.append(trigger_run(job.name, given, trigger=trigger, requested_by=reason).id)
    except (SparkJobError, InvalidEnqueue, UnknownTask, ValueError) as exc:
        raise DatasetError(f"dataset {name!r}: {exc}; nothing queued") from None
    state = "queued" if runs or items else "nothing to do"
    result = {"dataset": name, "partitions": keys, "runs": runs, "items": items, "state": state}
    if isinstance(ds.partitioning, MultiPartitions):
        result["dimensions"] = list(ds.partitioning.names)
    return result


def wait(result: dict[str, Any], *, timeout: float | None = None, poll: float = 0.5) -> dict[str, Any]:
    """Follow `result`'s runs to their end: state "succeeded" when every run succeeded and no materialization of
    the dataset they recorded has blocking checks failed (pending ones are waited for), "failed" when a run ended
    otherwise or a blocking check failed, "timed out" when `timeout` passed first ("nothing to do" stays)."""
    items = result.get("items", [])
    if not result["runs"] and not items:
        return result
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        states = dict(SparkRun.objects.filter(id__in=result["runs"]).values_list("id", "state"))
        item_states = dict(QueueItem.objects.filter(id__in=items).values_list("id", "state"))  # archived: done
        if all(states.get(run_id) in SPARK_FINAL_STATES for run_id in result["runs"]) and all(
            item_states.get(item_id, ItemState.DONE) in ITEM_FINAL_STATES for item_id in items
        ):
            if not all(states[run_id] == SparkRunState.SUCCEEDED for run_id in result["runs"]) or not all(
                item_states.get(item_id, ItemState.DONE) == ItemState.DONE for item_id in items
            ):
                return {**result, "state": "failed"}
            recorded = Materialization.objects.filter(  # the materialization_partition index, then the runs
                dataset=result["dataset"], partition__in=result["partitions"]
            ).filter(Q(spark_run_id__in=result["runs"]) | Q(item_id__in=items))
            checks = set(recorded.values_list("checks", flat=True))
            if CheckState.FAILED in checks:
                return {**result, "state": "failed"}
            if CheckState.PENDING not in checks:
                return {**result, "state": "succeeded"}
        if deadline is not None and time.monotonic() >= deadline:
            return {**result, "state": "timed out"}
        time.sleep(poll)
