"""Durable sleep (issue 39): `wf.sleep(name, seconds=... | until=...)` is a delayed no-op item, so a sleeping
workflow holds no worker slot and no connection; cancel and repair treat the step like any other."""

import datetime as dt

import pytest

from queue_app import engine
from queue_app.models import QueueItem
from queue_app.workflows import WorkflowDefinitionError, services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.waiting import wait_for
from tests.tasks import workflow_waits_tasks  # noqa: F401  (registers wf_nap)

pytestmark = pytest.mark.django_db(transaction=True)


def step(w: Workflow, name: str) -> WorkflowStep:
    return WorkflowStep.objects.get(workflow=w, attempt=Workflow.objects.get(id=w.id).attempt, name=name)


def states(w: Workflow) -> dict[str, str]:
    return {s["name"]: s["state"] for s in services.status(w.id)["steps"]}


def finished(w: Workflow, timeout: float = 90) -> Workflow:
    return wait_for(lambda: (x := Workflow.objects.get(id=w.id)).is_final and x, timeout, what=f"workflow {w.id}")


@pytest.mark.slow
def test_a_workflow_sleeps_then_continues_and_nothing_wakes_early(waits_worker):
    waits_worker()
    w = services.start("wf_nap", {"seconds": 1.5})
    assert finished(w).state == "succeeded"
    nap, after = step(w, "nap"), step(w, "after")
    item = QueueItem.objects.get(id=nap.item_id)
    assert item.run_at == item.created_at + dt.timedelta(seconds=1.5)  # due 1.5 s after the step became ready
    assert nap.finished_at >= item.run_at and after.ready_at >= item.run_at
    assert after.result == {"nap": None}


@pytest.mark.slow
def test_a_sleeping_workflow_holds_no_worker_slot_and_shows_sleeping(waits_worker):
    waits_worker(concurrency=1)
    w = services.start("wf_nap", {"seconds": 3600})
    wait_for(lambda: states(w)["nap"] == "sleeping", 60, what="the nap to start")
    plain = engine.enqueue("queue_app.noop")  # the one slot is free: it runs while the workflow sleeps
    wait_for(lambda: QueueItem.objects.get(id=plain.id).state == "done", 60, what="a plain item to run")
    assert states(w) == {"first": "succeeded", "nap": "sleeping", "after": "waiting"}
    item = QueueItem.objects.get(id=step(w, "nap").item_id)
    assert item.state == "ready" and item.run_at > item.created_at + dt.timedelta(seconds=3500)


def test_cancel_and_repair_treat_a_sleep_like_any_step():
    g = Graph("naps")
    g.sleep("nap", seconds=3600)
    g.task("wf.add", name="after", after=["nap"])
    w = services.start_graph(g)
    assert states(w) == {"nap": "sleeping", "after": "waiting"}
    first_item = step(w, "nap").item_id
    assert services.cancel(w.id, actor="test")
    assert Workflow.objects.get(id=w.id).state == "cancelled"
    assert QueueItem.objects.get(id=first_item).state == "cancelled"
    assert services.repair(w.id).attempt == 2
    again = step(w, "nap")
    assert states(w) == {"nap": "sleeping", "after": "waiting"} and again.item_id != first_item
    assert QueueItem.objects.get(id=again.item_id).state == "ready"


def test_sleep_until_a_time_is_due_then():
    at = dt.datetime(2099, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    g = Graph("until")
    g.sleep("nap", until=at)
    w = services.start_graph(g)
    item = QueueItem.objects.get(id=step(w, "nap").item_id)
    assert item.run_at == at and item.visible_at == at
    past = Graph("past")
    past.sleep("nap", until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    w2 = services.start_graph(past)
    late = QueueItem.objects.get(id=step(w2, "nap").item_id)
    assert late.run_at == late.created_at  # a time already past: due at once


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "one of them"),
        ({"seconds": 1, "until": dt.datetime(2099, 1, 1, tzinfo=dt.UTC)}, "one of them"),
        ({"seconds": 0}, "above 0"),
        ({"seconds": -1}, "above 0"),
        ({"seconds": "10"}, "above 0"),
        ({"until": dt.datetime(2099, 1, 1)}, "timezone-aware"),
    ],
)
def test_a_bad_sleep_is_refused_and_writes_nothing(kwargs, message):
    g = Graph("bad")
    with pytest.raises(WorkflowDefinitionError, match=message):
        g.sleep("nap", **kwargs)
    assert not Workflow.objects.exists()
