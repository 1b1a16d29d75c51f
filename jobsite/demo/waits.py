"""`demo_waits`: the shipped demo of a workflow that waits (issue 39), walked in a minute from the CLI and the
admin (docs/how-to/workflow-waits.md, "Walk the demo").

    nap (sleep 2 s)
      -> paid (waits for the event demo.paid with key = the order, at most 1 h)
      -> approve (an approval: a user with jobsite_workflows.start_workflow approves or rejects it)
      -> route (a branch on paid's "amount": over 100 runs big, else small; the other ends skipped)
      -> big | small
      -> summary (run_if none_failed: it runs after whichever of big and small ran)
"""

from typing import Any

from queue_app.params import Param
from queue_app.registry import Context, job
from queue_app.workflows import services
from queue_app.workflows.definition import workflow

EVENT = "demo.paid"
THRESHOLD = 100
PERMISSION = "jobsite_workflows.start_workflow"


@job("demo.big_order")
def big_order(payload: Any, ctx: Context) -> dict[str, Any]:
    """The branch for an amount over 100."""
    return {"order": payload["order"], "handled_as": "big"}


@job("demo.small_order")
def small_order(payload: Any, ctx: Context) -> dict[str, Any]:
    """The branch for an amount of 100 or less."""
    return {"order": payload["order"], "handled_as": "small"}


@job("demo.waits_summary")
def waits_summary(payload: Any, ctx: Context) -> dict[str, Any]:
    """What ran: the result of the branch taken (the skipped one has none)."""
    ran = {name: result for name, result in services.upstream(ctx).items() if result is not None}
    return {"order": payload["order"], **ran}


@workflow("demo_waits", params=[Param("order", "str", default="demo-1", help="Order key of the demo.paid event")])
def demo_waits(wf, params):
    """Sleep 2 s -> wait for demo.paid (key: the order) -> approval -> branch on the amount -> summary."""
    order = params["order"]
    nap = wf.sleep("nap", seconds=2)
    paid = wf.wait_event("paid", event=EVENT, key="{order}", timeout=3600, after=[nap])
    approve = wf.approval("approve", permission=PERMISSION, after=[paid])
    route = wf.branch(
        "route", on=paid, path="amount", op=">", value=THRESHOLD, then=["big"], otherwise=["small"], after=[approve]
    )
    big = wf.task("demo.big_order", {"order": order}, name="big", after=[route])
    small = wf.task("demo.small_order", {"order": order}, name="small", after=[route])
    wf.task("demo.waits_summary", {"order": order}, name="summary", after=[big, small], run_if="none_failed")
