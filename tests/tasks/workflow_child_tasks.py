"""Workflows with sub-workflow steps (issue 48), for the in-process tests and the real workers
(`run_worker --import tests.tasks.workflow_child_tasks`)."""

from typing import Any

from queue_app.registry import Context, job
from queue_app.workflows import Param, services, workflow
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.add, wf.until_fixed, wf.slow, wf.undo)


@job("wf.child_total")
def child_total(payload: Any, ctx: Context) -> int:
    """The sum of the results its sub-workflow steps passed on (each {"results": {step: value}})."""
    got = services.upstream(ctx)
    return sum(v for r in got.values() if isinstance(r, dict) for v in r["results"].values() if isinstance(v, int))


@workflow("wf_child", params=[Param("x", "int", default=1)])
def child(wf, params):
    a = wf.task("wf.add", {"x": params["x"]}, name="a")
    wf.task("wf.add", {"x": 1}, name="b", after=[a])


@workflow("wf_parent", params=[Param("x", "int", default=1)])
def parent(wf, params):
    first = wf.task("wf.add", {"x": 0}, name="first", compensate="wf.undo")
    c = wf.workflow("wf_child", {"x": params["x"]}, name="child", after=[first])
    wf.task("wf.child_total", name="total", after=[c])


@workflow("wf_child_fails")
def child_fails(wf, params):
    a = wf.task("wf.add", {"x": 1}, name="a")
    wf.task("wf.until_fixed", name="b", after=[a])


@workflow("wf_parent_fails")
def parent_fails(wf, params):
    first = wf.task("wf.add", {"x": 0}, name="first", compensate="wf.undo")
    c = wf.workflow("wf_child_fails", name="child", after=[first])
    wf.task("wf.child_total", name="total", after=[c])


@workflow("wf_child_slow")
def child_slow(wf, params):
    wf.task("wf.slow", {"seconds": 60}, name="slow")


@workflow("wf_parent_slow")
def parent_slow(wf, params):
    wf.workflow("wf_child_slow", name="child")


@workflow("wf_parent_keyed", params=[Param("k", "str", required=True)])
def parent_keyed(wf, params):
    # after a first step: its start is an item a worker runs (the race test holds the key's claim against it)
    first = wf.task("wf.add", {"x": 0}, name="first")
    c = wf.workflow("wf_child", {"x": 5}, key="shared-{k}", name="child", after=[first])
    wf.task("wf.child_total", name="total", after=[c])


@workflow("wf_grandparent")
def grandparent(wf, params):
    wf.workflow("wf_parent", {"x": 2}, name="parent")


@workflow("wf_ping")
def ping(wf, params):
    wf.workflow("wf_pong", name="pong")


@workflow("wf_pong")
def pong(wf, params):
    wf.workflow("wf_ping", name="ping")
