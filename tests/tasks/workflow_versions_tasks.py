"""Tasks and workflows for the tests of workflow versions, forks and deadlines (issue 39), run by real workers
(`run_worker --import tests.tasks.workflow_versions_tasks`). `wfv_versioned` builds another graph once a ProbeEffect
row "wfv-v2" exists (its "current definition" changes under a running test), and one naming a task that no longer
exists once "wfv-v3" exists."""

import time
import uuid
from typing import Any

from queue_app.models import ProbeEffect
from queue_app.registry import Context, Retry, job
from queue_app.workflows import services, workflow
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.slow, wf.undo, wf.add)


@job("wfv.stamp", retry=Retry(times=2, delay=0))
def stamp(payload: Any, ctx: Context) -> dict[str, Any]:
    """A result unique to this run, and what it waited for."""
    return {"run": uuid.uuid4().hex, "at": time.time(), "upstream": sorted(services.upstream(ctx))}


@job("wfv.flaky", retry=Retry(times=1))
def flaky(payload: Any, ctx: Context) -> str:
    """Fails until a ProbeEffect row "wfv-fixed" exists."""
    if not ProbeEffect.objects.filter(key="wfv-fixed").exists():
        raise RuntimeError("not fixed yet")
    return "fixed"


@workflow("wfv_chain")
def chain(wf, params):
    a = wf.task("wfv.stamp", {"s": "a"}, name="a")
    b = wf.task("wfv.stamp", {"s": "b"}, name="b", after=[a])
    side = wf.task("wfv.stamp", {"s": "side"}, name="side", after=[a])
    wf.task("wfv.stamp", {"s": "c"}, name="c", after=[b, side])


@workflow("wfv_versioned")
def versioned(wf, params):
    v2 = ProbeEffect.objects.filter(key="wfv-v2").exists()
    v3 = ProbeEffect.objects.filter(key="wfv-v3").exists()
    a = wf.task("wfv.stamp", {"s": "a"}, name="a")
    b = wf.task("wfv.flaky", name="b", after=[a])
    wf.task("wfv.stamp", {"s": "c"}, name="c", after=[b])
    if v2:
        wf.task("wfv.stamp", {"s": "d"}, name="d", after=[b])
    if v3:
        wf.task("wfv.removed", name="e", after=[b])
