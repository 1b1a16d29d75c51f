"""The datasets and producer task of tests/datasets/processes/test_datasets_stale_producer.py, loaded by its workers
with `run_worker --import tests.tasks.stale_producer_declared` (which calls declare()); in process the tests call
declare() and undeclare() themselves.

- sp_daily: daily, at most an hour old, trigger_producer_when_stale=True; its producer is the task tests.sp_build;
- tests.sp_build {"dataset", "partition", "reason"}: records a materialization of sp_built (no policy) for the
  partition, with the reason, so "the producer ran once" is one sp_built row. It does not write sp_daily, so the
  dataset stays stale and every later check meets the same episode.
"""

import datetime as dt

from django.db import transaction

from queue_app.datasets import Freshness, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.producers import forget_task, producer_task
from queue_app.datasets.services import record_materialization
from queue_app.registry import Context, job

STALE = "sp_daily"
BUILT = "sp_built"


def declare() -> None:
    if _code.get(STALE) is None:
        dataset(
            STALE,
            location=f"table:tests.{STALE}",
            partitioning="daily",
            freshness=Freshness(max_age=dt.timedelta(hours=1)),
            trigger_producer_when_stale=True,
        )
    if _code.get(BUILT) is None:
        dataset(BUILT, location=f"table:tests.{BUILT}", partitioning="daily")
    producer_task("tests.sp_build", produces=[STALE])


def undeclare() -> None:
    forget_task("tests.sp_build")
    for name in (STALE, BUILT):
        _code.unregister(name)


@job("tests.sp_build")
def build(payload: dict, ctx: Context) -> None:
    with transaction.atomic():
        record_materialization(
            BUILT, payload["partition"], item_id=ctx.item_id, metadata={"for": payload["dataset"], **payload}
        )
