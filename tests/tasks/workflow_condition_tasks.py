"""Tasks and workflows for the conditions tests (`run_worker --import tests.tasks.workflow_condition_tasks`)."""

from typing import Any

from queue_app.registry import Context, Retry, job
from queue_app.workflows import Param, workflow
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.add, wf.boom)


@job("wf.value")
def value(payload: Any, ctx: Context) -> Any:
    """Returns its payload: what a branch reads."""
    return payload


@job("wf.pick", retry=Retry(times=1))
def pick(payload: Any, ctx: Context) -> Any:
    """A branch task: returns the names in its payload."""
    return payload["names"]


@workflow("wf_branch", params=[Param("amount", "int", default=120)])
def branching(wf, params):
    """check -> route (amount > 100: big, else small) -> big | small -> end (none_failed) -> after_end."""
    check = wf.task("wf.value", {"amount": params["amount"]}, name="check")
    route = wf.branch("route", on=check, path="amount", op=">", value=100, then=["big"], otherwise=["small"])
    big = wf.task("wf.add", {"x": 1}, name="big", after=[route])
    small = wf.task("wf.add", {"x": 2}, name="small", after=[route])
    below = wf.task("wf.add", {"x": 3}, name="below_small", after=[small])  # skipped with small
    end = wf.task("wf.add", {"x": 10}, name="end", after=[big, below], run_if="none_failed")
    wf.task("wf.add", {"x": 100}, name="after_end", after=[end])


@workflow("wf_rules")
def rules(wf, params):
    """ok succeeds, bad fails (on_failure continue); one step per rule after both."""
    ok = wf.task("wf.add", {"x": 1}, name="ok")
    bad = wf.task("wf.boom", name="bad", on_failure="continue")
    for rule in ("all_succeeded", "all_done", "any_failed", "none_failed"):
        wf.task("wf.add", {"x": 1}, name=rule, after=[ok, bad], run_if=rule)
