"""A Spark run's item reserved and its handler run here, as a worker would: for the datasets' Spark-run tests."""

from queue_app.registry import Context, Delivery, Settled, get_task
from queue_app.reservations import reserve
from queue_app.spark.runs import QUEUE, TASK
from tests.support.spark_fixtures import require_spark, spark_session  # noqa: F401  (`spark`)


def reserve_run_item(run_id: int):
    """Reserve the run's item as a worker would, and the Context its handler gets."""
    held = reserve(QUEUE, timeout=30, lease=120)
    assert held is not None and held.payload == {"run_id": run_id}
    ctx = Context(
        item_id=held.item_id,
        reservation_id=held.reservation_id,
        attempt=held.attempt,
        max_attempts=held.max_attempts,
        task=TASK,
        queue=QUEUE,
        delivery=Delivery.AT_LEAST_ONCE,
        worker_id="test",
    )
    return held, ctx


def run_handler(run_id: int):
    """Reserve the run's item and run the Spark task's handler on it here, as a worker would; the item is
    settled when the handler returns (or raises)."""
    held, ctx = reserve_run_item(run_id)
    with held:
        held.result = get_task(TASK)(held.payload, ctx)
    settled = held.result  # the handler settles its item with the run's end (registry.Settled)
    return settled.result if isinstance(settled, Settled) and settled.fate == "done" else settled
