"""Datasets, tasks and data-aware triggers of tests/test_datasets_triggers*.py and the chaos trigger scenario,
loaded by their workers with `run_worker --import tests.tasks.trigger_declared` (which calls declare()); in process the
tests call declare() and undeclare() themselves.

- tests.trig_upstream {"dataset", "partition", "hold", "fail"}: records a materialization of the dataset's
  partition in its transaction, holds it open `hold` seconds (so two upstreams' transactions overlap), and with
  `fail` raises after recording (the transaction rolls back: a run that wrote and failed records nothing);
- the consumers (tests.trig_all: tt_a and tt_b, all; tests.trig_any: any; tests.trig_debounced: tt_c, debounced
  1.5 s) each record a materialization of their own output dataset, so "ran once" is one row per partition;
- mapped (datasets/mappings.py): tests.trig_weekly reads the seven days of tt_daily a week holds (TimeWindow
  to weekly) and records tt_weekly_out; tests.trig_regions reads a day of every region of tt_region (day|region,
  AllOf("region")) and records tt_regions_out;
- the Spark job tt_build produces tt_days (`dataset materialize` queues its runs; nothing here runs them).
"""

import time

from django.db import transaction

from queue_app.datasets import MultiPartitions, StaticPartitions, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.mappings import AllOf, TimeWindow
from queue_app.datasets.services import record_materialization
from queue_app.datasets.triggers import forget_task, trigger_task
from queue_app.params import Param
from queue_app.registry import Context, Retry, job
from queue_app.spark.registry import _jobs, spark_job

UPSTREAMS = ("tt_a", "tt_b", "tt_c")
PRODUCED = "tt_days"
OUTPUTS = {"tests.trig_all": "tt_all_out", "tests.trig_any": "tt_any_out", "tests.trig_debounced": "tt_deb_out"}
MAPPED = {"tests.trig_weekly": "tt_weekly_out", "tests.trig_regions": "tt_regions_out"}
REGIONS = ("eu", "us", "apac")
MAPPED_DATASETS = {
    "tt_daily": "daily",
    "tt_weekly_out": "weekly",
    "tt_region": MultiPartitions(day="daily", region=StaticPartitions(REGIONS)),
    "tt_regions_out": "daily",
}
DEBOUNCE = 1.5


class WroteThenFailed(Exception):
    pass


def declare() -> None:
    for name in (*UPSTREAMS, *OUTPUTS.values(), PRODUCED):
        if _code.get(name) is None:
            dataset(name, location=f"table:tests.{name}", partitioning="daily")
    spark_job("tt_build", params=[Param("day", "date", required=True)], produces={PRODUCED: "day"})(_build)
    trigger_task("tests.trig_all", on_update=["tt_a", "tt_b"], mode="all", produces=["tt_all_out"])
    trigger_task("tests.trig_any", on_update=["tt_a", "tt_b"], mode="any", produces=["tt_any_out"])
    trigger_task("tests.trig_debounced", on_update=["tt_c"], debounce=DEBOUNCE, produces=["tt_deb_out"])
    for name, partitioning in MAPPED_DATASETS.items():
        if _code.get(name) is None:
            dataset(name, location=f"table:tests.{name}", partitioning=partitioning)
    trigger_task("tests.trig_weekly", on_update={"tt_daily": TimeWindow(to="weekly")}, produces=["tt_weekly_out"])
    trigger_task("tests.trig_regions", on_update={"tt_region": AllOf("region")}, produces=["tt_regions_out"])


def undeclare() -> None:
    for task in (*OUTPUTS, *MAPPED):
        forget_task(task)
    _jobs.unregister("tt_build")
    for name in (*UPSTREAMS, *OUTPUTS.values(), PRODUCED, *MAPPED_DATASETS):
        _code.unregister(name)


def _build(spark, params):
    return {}


@job("tests.trig_upstream", retry=Retry(times=1, delay=0))
def upstream(payload: dict, ctx: Context) -> None:
    with transaction.atomic():
        record_materialization(payload["dataset"], payload["partition"], item_id=ctx.item_id)
        time.sleep(payload.get("hold", 0))
        if payload.get("fail"):
            raise WroteThenFailed("wrote the partition, then failed")


def _consume(payload: dict, ctx: Context, output: str) -> None:
    with transaction.atomic():
        record_materialization(
            output, payload["partition"], item_id=ctx.item_id, metadata={"upstream": payload["upstream"]}
        )


@job("tests.trig_all")
def consume_all(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "tt_all_out")


@job("tests.trig_any")
def consume_any(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "tt_any_out")


@job("tests.trig_weekly")
def consume_weekly(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "tt_weekly_out")


@job("tests.trig_regions")
def consume_regions(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "tt_regions_out")


@job("tests.trig_debounced")
def consume_debounced(payload: dict, ctx: Context) -> None:
    _consume(payload, ctx, "tt_deb_out")
