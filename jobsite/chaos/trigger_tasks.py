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
  AllOf the source) into chaos_fanin_out; the harness adds the sources' keys before planting.
"""

import time
from typing import Any

from django.contrib.auth.models import User

from queue_app.datasets import DynamicPartitions, MultiPartitions, dataset
from queue_app.datasets.checks_run import override_failed_checks
from queue_app.datasets.declarations import _code
from queue_app.datasets.mappings import AllOf, TimeWindow
from queue_app.datasets.models import CheckState, Materialization
from queue_app.datasets.quality import CheckResult, all_checks, check
from queue_app.datasets.services import record_materialization
from queue_app.datasets.triggers import trigger_task
from queue_app.registry import Context, Delivery, job

from .trigger_checks import CHECKED, CONSUMERS, MAPPED, REGION, SOURCES_SET, UPSTREAMS  # what the checks judge

UPSTREAM_TASK = "jobsite.chaos_upstream"
OVERRIDE_TASK = "jobsite.chaos_override"
OVERRIDE_USER = "chaos-override"

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
