"""The workflow bench's task (workers load it with `--import jobsite.bench.workflow_tasks`)."""

from typing import Any

from queue_app.registry import Context, job
from queue_app.workflows import services, workflow


@job("bench.fan_out", hard_timeout=120.0)
def fan_out(payload: Any, ctx: Context) -> dict[str, int]:
    """Add `n` queue_app.noop steps (fan-out); whoever waits for this step waits for them too (fan-in)."""
    services.fan_out(ctx, "queue_app.noop", {str(i): None for i in range(payload["n"])}, group="noop")
    return {"added": payload["n"]}


@workflow("bench.child")
def bench_child(wf: Any, params: Any) -> None:
    """The child of the sub-workflow step the workflow part measures (bench/workflow_children.py): one noop step."""
    wf.task("queue_app.noop", name="noop")
