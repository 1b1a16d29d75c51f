"""The workflows' built-in task: `queue_app.workflow_finished` sends the `workflow_finished` signal."""

from typing import Any

from ..registry import Context, Delivery, Retry, job
from . import deadlines
from .conditions import choose
from .definition import (
    APPROVAL_TIMEOUT_TASK,
    BRANCH_TASK,
    CHILD_CANCEL_TASK,
    CHILD_START_TASK,
    CHILD_WAIT_TASK,
    DEADLINE_TASK,
    EVENT_TIMEOUT_TASK,
    SLEEP_TASK,
)
from .models import Workflow
from .signals import workflow_finished


# Transactional: a receiver's database writes (the webhooks' publish_event) commit with this item's settle, so
# each end is heard exactly once by what it writes here.
@job("queue_app.workflow_finished", delivery=Delivery.TRANSACTIONAL)
def finished(payload: Any, ctx: Context) -> dict[str, Any]:
    workflow = Workflow.objects.get(id=payload["workflow_id"])
    workflow_finished.send(sender=Workflow, workflow=workflow, state=payload["state"])
    return {"workflow_id": workflow.id, "state": payload["state"]}


@job(SLEEP_TASK)
def sleep(payload: Any, ctx: Context) -> None:
    """A sleep step's item (delayed until the sleep is over): leased once due, it ends the step."""


class EventTimeout(Exception):
    pass


@job(EVENT_TIMEOUT_TASK, retry=Retry(times=1))
def event_timeout(payload: Any, ctx: Context) -> None:
    """An event wait's timeout (delayed until then): leased while the wait is still open (an event ends the wait
    by settling this item while it is ready), it ends the step: failed (on_timeout "fail": this raises, once) or
    succeeded with no payload ("continue")."""
    if payload["on_timeout"] == "fail":
        raise EventTimeout(
            f"no event {payload['event']!r} with key {payload['key']!r} came within {payload['timeout']:g} s"
        )


class ApprovalTimeout(Exception):
    pass


@job(APPROVAL_TIMEOUT_TASK, retry=Retry(times=1))
def approval_timeout(payload: Any, ctx: Context) -> dict[str, Any] | None:
    """An approval's timeout (delayed until then): leased while nobody has decided (a decision settles this item
    while it is ready, workflows/approvals.py), it ends the step: failed (on_timeout "fail": this raises, once)
    or succeeded with {"approved": None, "timed_out": True} ("continue")."""
    if payload["on_timeout"] == "fail":
        raise ApprovalTimeout(f"nobody approved or rejected within {payload['timeout']:g} s")
    return {"approved": None, "timed_out": True}


@job(DEADLINE_TASK)
def deadline(payload: Any, ctx: Context) -> dict[str, bool]:
    """A workflow's or a step's deadline (delayed until then, workflows/deadlines.py): cancels what it covers
    if that is still open, in one transaction; otherwise (ended, repaired, run twice) it changes nothing."""
    return {"acted": deadlines.passed(payload["workflow_id"], payload["attempt"], payload.get("step_id"))}


@job(BRANCH_TASK, retry=Retry(times=1))
def branch(payload: Any, ctx: Context) -> dict[str, Any]:
    """A branch step (`wf.branch`): reads the result of the step it is on, returns {"chosen", "value",
    "matched"}; the settle trigger skips the downstream steps not chosen. A missing path fails it (once)."""
    from . import services

    return choose(payload, services.upstream(ctx))


@job("queue_app.workflow_probe_fan_out")
def probe_fan_out(payload: Any, ctx: Context) -> dict[str, int]:
    """For chaos runs and tests: fan out `n` probe steps per group ({group: probe task}), each with `compensate`
    (a task name, optional) and payload `child` (default {}). Idempotent: a re-run adds nothing twice."""
    from . import services

    for group, task in payload["groups"].items():
        services.fan_out(
            ctx,
            task,
            {str(i): payload.get("child", {}) for i in range(payload["n"])},
            group=group,
            compensate=payload.get("compensate"),
        )
    return {"added": payload["n"] * len(payload["groups"])}


class ChildWaitTimeout(Exception):
    pass


@job(CHILD_WAIT_TASK, retry=Retry(times=1))
def child_wait(payload: Any, ctx: Context) -> None:
    """A sub-workflow step's wait (a delayed item due in a century): its child's end settles it while it is ready
    (workflows/children.py). Leased only if nothing ended it in that time: the step fails."""
    raise ChildWaitTimeout(f"child workflow {payload.get('workflow')!r} never ended")


# Transactional: the child's start (or its repair, or the link to the one its key names) commits with this item's
# settle, so a step starts its child once.
@job(CHILD_START_TASK, delivery=Delivery.TRANSACTIONAL)
def start_child(payload: Any, ctx: Context) -> dict[str, Any]:
    """A sub-workflow step that became ready: start its child (workflows/children.py)."""
    from . import child_steps

    return child_steps.start_child(payload["step_id"], payload)


@job(CHILD_CANCEL_TASK)
def cancel_child(payload: Any, ctx: Context) -> dict[str, Any]:
    """A sub-workflow step cancelled while it waited: cancel its child (workflows/children.py)."""
    from . import child_steps

    return child_steps.cancel_child(payload["step_id"])
