"""The datasets, tasks and data-aware triggers of `queue_chaos --triggers` (triggers.py), imported by its workers
(`run_worker --import queue_app.chaos.trigger_tasks`) and by the harness.

- queue_app.chaos_upstream {"dataset", "partition", "sleep"}: records the partition (transactional delivery: the
  record commits with the item's settle, so once), then sleeps so kills land mid-transaction;
- queue_app.chaos_consume_all (chaos_a and chaos_b, all) and queue_app.chaos_consume_any (any): record their
  output dataset's partition with the upstream ids they were given, transactional too, so a row is a run.
"""

import time
from typing import Any

from ..datasets import dataset
from ..datasets.declarations import _code
from ..datasets.services import record_materialization
from ..datasets.triggers import trigger_task
from ..registry import Context, Delivery, job

UPSTREAMS = ("chaos_a", "chaos_b")
CONSUMERS = {"queue_app.chaos_consume_all": "chaos_all_out", "queue_app.chaos_consume_any": "chaos_any_out"}
UPSTREAM_TASK = "queue_app.chaos_upstream"

for _name in (*UPSTREAMS, *CONSUMERS.values()):
    if _code.get(_name) is None:
        dataset(_name, location=f"table:chaos.{_name}", partitioning="daily")
trigger_task("queue_app.chaos_consume_all", on_update=list(UPSTREAMS), mode="all", produces=["chaos_all_out"])
trigger_task("queue_app.chaos_consume_any", on_update=list(UPSTREAMS), mode="any", produces=["chaos_any_out"])


@job(UPSTREAM_TASK, delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def upstream(payload: dict, ctx: Context) -> None:
    record_materialization(payload["dataset"], payload["partition"], item_id=ctx.item_id)
    time.sleep(float(payload.get("sleep", 0)))


def _consume(payload: Any, ctx: Context, output: str) -> None:
    record_materialization(
        output, payload["partition"], item_id=ctx.item_id, metadata={"upstream": payload["upstream"]}
    )


@job("queue_app.chaos_consume_all", delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_all(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "chaos_all_out")


@job("queue_app.chaos_consume_any", delivery=Delivery.TRANSACTIONAL, hard_timeout=30)
def consume_any(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "chaos_any_out")
