"""The datasets bench's tasks and declarations (workers load them with `--import jobsite.bench.dataset_tasks`):

- bench.ds_record {"dataset", "partition"}: records the partition in its own transaction and returns how long the
  record took (with the data-aware trigger of its consumers: the time from materialized to consumer queued, which
  happen in that one transaction);
- bench.ds_consume: the `all` consumer of bench_a and bench_b (a no-op);
- bench.ds_window: the consumer of the last 7 days of bench_daily (TimeWindow(last=7): each day's record moves
  the seven windows that hold it, and completes one), a no-op.
"""

import time
from typing import Any

from django.db import transaction

from queue_app.datasets import dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.mappings import TimeWindow
from queue_app.datasets.services import record_materialization
from queue_app.datasets.triggers import trigger_task
from queue_app.registry import Context, job

for _name in ("bench_a", "bench_b", "bench_plain", "bench_daily"):
    if _code.get(_name) is None:
        dataset(_name, location=f"table:bench.{_name}", partitioning="daily")
trigger_task("bench.ds_consume", on_update=["bench_a", "bench_b"], mode="all")
trigger_task("bench.ds_window", on_update={"bench_daily": TimeWindow(last=7)}, mode="all")


@job("bench.ds_record")
def record(payload: Any, ctx: Context) -> dict[str, float]:
    t0 = time.perf_counter()
    with transaction.atomic():
        record_materialization(payload["dataset"], payload["partition"], item_id=ctx.item_id)
    return {"ms": (time.perf_counter() - t0) * 1000}


@job("bench.ds_consume")
def consume(payload: Any, ctx: Context) -> None:
    return None


@job("bench.ds_window")
def window(payload: Any, ctx: Context) -> None:
    return None
