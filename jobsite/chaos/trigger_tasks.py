"""The datasets, tasks and data-aware triggers of `queue_chaos --triggers` (triggers.py), imported by its workers
(`run_worker --import jobsite.chaos.trigger_tasks`) and by the harness.

- jobsite.chaos_upstream {"dataset", "partition", "sleep", "bad"}: records the partition (transactional
  delivery: the record commits with the item's settle, so once), then sleeps so kills land mid-transaction; with
  `bad` its metadata says so, and chaos_a's blocking check chaos_not_bad (run as queue_app.dataset_check items by
  the same workers) fails it, so no consumer runs on it;
- jobsite.chaos_override {"partition"}: overrides the failed checks of chaos_a's partition as the user
  chaos-override (transactional: the override commits with the item, so once; already overridden: nothing);
- jobsite.chaos_consume_all (chaos_a and chaos_b, all) and jobsite.chaos_consume_any (any): record their
  output dataset's partition with the upstream ids they were given, transactional too, so a row is a run;
- mapped: jobsite.chaos_consume_week reads a week of chaos_b (TimeWindow to weekly) into chaos_week_out, and
  jobsite.chaos_consume_fanin a day of every source of chaos_region (by day and the dynamic set chaos_sources,
  AllOf the source) into chaos_fanin_out; the harness adds the sources' keys before planting;
- dynamic keys removed while their runs start: jobsite.chaos_request_cust {"key"} asks `materialize` for the
  key's partition of chaos_cust (by the dynamic set chaos_customers; refused when the key is removed), which
  queues an item of its producer jobsite.chaos_produce_cust (`@job(produces=)`, sleeping in its transaction so
  it stays open), whose success fires the trigger task jobsite.chaos_consume_cust; jobsite.chaos_churn {"key"}
  removes the key when it is in the set (refused while a run of it is open) and adds it again when not, its
  result saying what it did and the watermarks trigger_checks.churn_check judges the runs by. All transactional:
  a kill rolls an attempt back whole.
"""

import time
from typing import Any

from django.contrib.auth.models import User

from queue_app.datasets import DatasetError, DynamicPartitions, MultiPartitions, dataset, dynamic
from queue_app.datasets.checks_run import override_failed_checks
from queue_app.datasets.declarations import _code
from queue_app.datasets.mappings import AllOf, TimeWindow
from queue_app.datasets.materialize import materialize
from queue_app.datasets.models import CheckState, DynamicPartitionKey, Materialization
from queue_app.datasets.quality import CheckResult, all_checks, check
from queue_app.datasets.services import record_materialization
from queue_app.datasets.triggers import trigger_task
from queue_app.engine.alias import connection
from queue_app.registry import Context, Delivery, job

from .trigger_checks import (  # what the checks judge
    CHECKED,
    CHURN_CONSUMER,
    CHURN_DATASET,
    CHURN_PRODUCER,
    CHURN_REQUEST,
    CHURN_SET,
    CHURN_TASK,
    CONSUMERS,
    MAPPED,
    REGION,
    SOURCES_SET,
    UPSTREAMS,
    watermark,
)

UPSTREAM_TASK = "jobsite.chaos_upstream"
OVERRIDE_TASK = "jobsite.chaos_override"
OVERRIDE_USER = "chaos-override"
KEYS_QUEUE = "chaos_keys"  # the dynamic keys' items (requests, producer, consumer, churn): not behind the upstreams
SLEEP = 0.1  # seconds a chaos_cust producer item sleeps in its transaction: open long enough for removals to meet

for _name in (*UPSTREAMS, *CONSUMERS.values()):
    if _code.get(_name) is None:
        dataset(_name, location=f"table:chaos.{_name}", partitioning="daily")
trigger_task("jobsite.chaos_consume_all", on_update=list(UPSTREAMS), mode="all", produces=["chaos_all_out"])
trigger_task("jobsite.chaos_consume_any", on_update=list(UPSTREAMS), mode="any", produces=["chaos_any_out"])
if _code.get(REGION) is None:
    dataset(
        REGION,
        location=f"table:chaos.{REGION}",
        partitioning=MultiPartitions(day="daily", source=DynamicPartitions(SOURCES_SET)),
    )
    dataset("chaos_week_out", location="table:chaos.chaos_week_out", partitioning="weekly")
    dataset("chaos_fanin_out", location="table:chaos.chaos_fanin_out", partitioning="daily")
WEEK_TASK, FANIN_TASK = MAPPED
trigger_task(WEEK_TASK, on_update={"chaos_b": TimeWindow(to="weekly")}, produces=["chaos_week_out"])
trigger_task(FANIN_TASK, on_update={REGION: AllOf("source")}, produces=["chaos_fanin_out"])
if _code.get(CHURN_DATASET) is None:
    dataset(CHURN_DATASET, location=f"table:chaos.{CHURN_DATASET}", partitioning=DynamicPartitions(CHURN_SET))
trigger_task(CHURN_CONSUMER, on_update=[CHURN_DATASET], mode="any")


def not_bad(part) -> CheckResult:
    bad = bool(part.materialization.metadata.get("bad"))
    return CheckResult(not bad, {"bad": int(bad)}, "recorded bad" if bad else "")


if not any(c.dataset == CHECKED for c in all_checks()):
    check(CHECKED, name="chaos_not_bad", severity="error")(not_bad)


@job(UPSTREAM_TASK, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def upstream(payload: dict, ctx: Context) -> None:
    metadata = {"bad": True} if payload.get("bad") else {}
    record_materialization(payload["dataset"], payload["partition"], item_id=ctx.item_id, metadata=metadata)
    time.sleep(float(payload.get("sleep", 0)))


def _consume(payload: Any, ctx: Context, output: str) -> None:
    record_materialization(
        output, payload["partition"], item_id=ctx.item_id, metadata={"upstream": payload["upstream"]}
    )


@job("jobsite.chaos_consume_all", delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_all(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "chaos_all_out")


@job("jobsite.chaos_consume_any", delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_any(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "chaos_any_out")


@job(WEEK_TASK, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_week(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "chaos_week_out")


@job(FANIN_TASK, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_fanin(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "chaos_fanin_out")


@job(OVERRIDE_TASK, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def override(payload: dict, ctx: Context) -> str:
    latest = Materialization.objects.filter(dataset=CHECKED, partition=payload["partition"]).order_by("-at", "-id")
    m = latest.first()
    if m is None or m.checks != CheckState.FAILED:
        return f"nothing to override ({m.checks if m else 'none'})"
    override_failed_checks(User.objects.get(username=OVERRIDE_USER), m, "queue_chaos: a known bad marker")
    return f"overrode {m.id}"


@job(CHURN_REQUEST, queue=KEYS_QUEUE, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def request_partition(payload: dict, ctx: Context) -> Any:
    try:
        made = materialize(CHURN_DATASET, partition=payload["key"], params={"sleep": SLEEP}, requested_by="queue_chaos")
        return made["items"]
    except DatasetError as exc:  # the key is removed: nothing queued
        return f"refused: {exc}"[:200]


@job(CHURN_PRODUCER, queue=KEYS_QUEUE, delivery=Delivery.TRANSACTIONAL, hard_timeout=30, produces=[CHURN_DATASET])
def produce_partition(payload: dict, ctx: Context) -> dict:
    time.sleep(float(payload.get("params", {}).get("sleep", 0)))
    return {"rows": 1}  # its materialization is recorded in this transaction (datasets/producers.py)


@job(CHURN_CONSUMER, queue=KEYS_QUEUE, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_partition(payload: dict, ctx: Context) -> None:
    time.sleep(0.02)


def _watermark() -> dict[str, int]:
    with connection.cursor() as cursor:
        return watermark(cursor)


@job(CHURN_TASK, queue=KEYS_QUEUE, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def churn(payload: dict, ctx: Context) -> dict:
    """Remove the key if it is in the set, else add it again (as `dataset partitions remove|add` would); the result
    says which, with the watermarks: an addition's read before it inserts, a removal's after it (its row still
    locked: this transaction commits it), so every run of the key that validated it before has a smaller id."""
    key, by = payload["key"], f"chaos:{ctx.item_id}"
    current = DynamicPartitionKey.objects.filter(partition_set=CHURN_SET, key=key, removed_at__isnull=True)
    if not current.exists():
        mark = _watermark()
        return {"key": key, "op": "add", "added": bool(dynamic.add_keys(CHURN_SET, [key], by=by)), "watermark": mark}
    try:
        dynamic.remove_keys(CHURN_SET, [key], by=by)
    except DatasetError as exc:  # a run of it is open (named), or another churn item removed it first
        message = str(exc)
        named = message.split("is open (", 1)[1].split(")")[0].split(", ") if "is open (" in message else []
        return {"key": key, "op": "remove", "removed": False, "named": named, "error": message[:300]}
    return {"key": key, "op": "remove", "removed": True, "watermark": _watermark()}
