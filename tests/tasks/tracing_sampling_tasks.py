"""Tasks of tests/core/processes/test_tracing_sampling.py, loaded by its worker with `run_worker --import
tests.tasks.tracing_sampling_tasks`: a handler that enqueues one follow-up item (whose stored trace context shows which
trace, sampled or not, the handler ran in)."""

from queue_app import engine
from queue_app.registry import Context, job


@job("tests.enqueues_next", queue="otel_sampling")
def enqueues_next(payload: dict, ctx: Context) -> None:
    engine.enqueue("queue_app.noop", {"after": ctx.item_id}, queue="otel_sampling_next")
