"""Workflows that wait, for the tests of issue 39 (`run_worker --import tests.tasks.workflow_waits_tasks`)."""

from typing import Any

from queue_app.registry import Context, job
from queue_app.workflows import Param, services, workflow
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.add)


@job("wf.upstream")
def upstream(payload: Any, ctx: Context) -> dict[str, Any]:
    """The results of the steps it waited for."""
    return services.upstream(ctx)


@workflow("wf_nap", params=[Param("seconds", "float", default=1.0)])
def nap(wf, params):
    first = wf.task("wf.add", {"x": 1}, name="first")
    sleep = wf.sleep("nap", seconds=params["seconds"], after=[first])
    wf.task("wf.upstream", name="after", after=[sleep])


@workflow(
    "wf_paid",
    params=[
        Param("order", "str", required=True),
        Param("timeout", "float", default=3600.0),
        Param("policy", "str", default="fail"),
    ],
)
def paid(wf, params):
    first = wf.task("wf.add", {"x": 1}, name="first")
    wait = wf.wait_event(
        "paid",
        event="partner.callback",
        key="{order}",
        timeout=params["timeout"],
        on_timeout=params["policy"],
        after=[first],
    )
    wf.task("wf.upstream", name="use", after=[wait])


@workflow(
    "wf_approve",
    params=[Param("timeout", "float", default=0.0), Param("policy", "str", default="fail")],
)
def approve(wf, params):
    """first (compensated by wf.undo) -> approve (a human step: jobsite_workflows.repair_workflow) -> use."""
    first = wf.task("wf.add", {"x": 1}, name="first", compensate="wf.undo")
    ok = wf.approval(
        "approve",
        permission="jobsite_workflows.repair_workflow",
        timeout=params["timeout"] or None,
        on_timeout=params["policy"],
        after=[first],
    )
    wf.task("wf.upstream", name="use", after=[ok])
