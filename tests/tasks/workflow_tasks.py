"""Tasks and workflows the workflow tests run with real workers (`run_worker --import tests.tasks.workflow_tasks`)."""

import time
from typing import Any

from queue_app.registry import Context, Retry, job
from queue_app.workflows import Param, services, workflow


class Boom(Exception):
    pass


@job("wf.add", retry=Retry(times=2, delay=0))
def add(payload: Any, ctx: Context) -> int:
    """Its `x` plus the results of the steps it waited for."""
    if payload and payload.get("sleep"):
        time.sleep(payload["sleep"])
    got = services.upstream(ctx)
    return (payload or {}).get("x", 0) + sum(v for v in got.values() if isinstance(v, int))


@job("wf.fan", retry=Retry(times=2, delay=0))
def fan(payload: Any, ctx: Context) -> dict[str, int]:
    """Adds `n` wf.add steps {"x": i} (fan-out), their fan-in is whoever waits for this step."""
    n = payload["n"]
    services.fan_out(ctx, "wf.add", {str(i): {"x": i} for i in range(n)}, group="part", compensate=payload.get("undo"))
    return {"added": n}


@job("wf.boom", retry=Retry(times=1))
def boom(payload: Any, ctx: Context) -> None:
    raise Boom("wf.boom always fails")


@job("wf.until_fixed", retry=Retry(times=1))
def until_fixed(payload: Any, ctx: Context) -> str:
    """Fails until a ProbeEffect row "fixed" exists (what a repair is for)."""
    from queue_app.models import ProbeEffect

    if not ProbeEffect.objects.filter(key="fixed").exists():
        raise Boom("not fixed yet")
    return "fixed"


@job("wf.undo", retry=Retry(times=2, delay=0))
def undo(payload: Any, ctx: Context) -> dict[str, Any]:
    return {"undid": payload["step"], "at": time.time()}


@job("wf.slow", hard_timeout=60.0)
def slow(payload: Any, ctx: Context) -> None:
    deadline = time.monotonic() + payload.get("seconds", 30)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        ctx.extend_lease(70)  # raises StaleReservation once the workflow is cancelled: the step stops


@workflow("wf_diamond")
def diamond(wf, params):
    a = wf.task("wf.add", {"x": 1}, name="a")
    b = wf.task("wf.add", {"x": 10}, name="b", after=[a])
    c = wf.task("wf.add", {"x": 100}, name="c", after=[a])
    wf.task("wf.add", {"x": 1000}, name="d", after=[b, c])


@workflow("wf_fan", params=[Param("n", "int", default=10, min=1, max=100_000)])
def fan_in(wf, params):
    first = wf.task("wf.fan", {"n": params["n"]}, name="split")
    wf.task("wf.add", {"x": 0}, name="sum", after=[first])


@workflow("wf_saga")
def saga(wf, params):
    a = wf.task("wf.add", {"x": 1}, name="a", compensate="wf.undo")
    b = wf.task("wf.add", {"x": 2}, name="b", after=[a], compensate="wf.undo")
    c = wf.task("wf.add", {"x": 3}, name="c", after=[b])  # no compensation
    d = wf.task("wf.add", {"x": 4}, name="d", after=[c], compensate="wf.undo")
    wf.task("wf.boom", name="boom", after=[d], compensate="wf.undo")
    wf.task("wf.add", {"x": 5}, name="never", after=["boom"], compensate="wf.undo")
    wf.task("wf.add", {"x": 6}, name="side", compensate="wf.undo")


@workflow("wf_fails")
def fails(wf, params):
    a = wf.task("wf.add", {"x": 1}, name="a")
    b = wf.task("wf.until_fixed", name="b", after=[a])
    c = wf.task("wf.add", name="c", after=[b])
    wf.task("wf.add", name="d", after=[c])
    wf.task("wf.add", {"x": 7}, name="e", after=[a])


@workflow("wf_daily", params=[Param("day", "date", required=True)])
def daily(wf, params):
    split = wf.task("wf.fan", {"n": 3}, name="split")
    wf.task("wf.add", {"x": 0}, name="sum", after=[split])
