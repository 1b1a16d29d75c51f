"""A batch of events (issue 39): `waits.send_events([...])` stores and matches many events in one statement,
as `send_event` would one after another in the order given: per name and key the oldest waits end first, one
event each, the rest are kept for the lookback; one bad event refuses the whole batch, nothing written."""

import pytest
from django.db import transaction

from queue_app.workflows import WorkflowError, services, waits
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)
EVENT = "partner.callback"


def waiting(keys: list[str]) -> Workflow:
    g = Graph("batch waits")
    for i, key in enumerate(keys):
        g.wait_event(f"w{i}", event=EVENT, key=key, timeout=3600)
    return services.start_graph(g)


def test_a_batch_ends_the_oldest_waits_in_order_and_keeps_the_rest():
    w = waiting(["a", "a", "b"])
    steps = {s.name: s.id for s in WorkflowStep.objects.filter(workflow_id=w.id)}
    sent = waits.send_events(
        [(EVENT, "a", {"n": 1}), (EVENT, "c", {"n": 2}), (EVENT, "a", {"n": 3}), (EVENT, "a", {"n": 4})]
    )
    assert [s.step_id for s in sent] == [steps["w0"], None, steps["w1"], None]
    assert [s.workflow_id for s in sent] == [w.id, None, w.id, None]
    assert [s.id for s in sent] == sorted(s.id for s in sent)
    results = dict(WorkflowStep.objects.filter(workflow_id=w.id).values_list("name", "result"))
    assert results == {"w0": {"n": 1}, "w1": {"n": 3}, "w2": None}
    assert dict(WorkflowEvent.objects.values_list("id", "step_id")) == {s.id: s.step_id for s in sent}
    # The kept "a" event is claimed by the next wait for it, as any kept event; "b" is still waiting.
    later = waiting(["a"])
    assert WorkflowEvent.objects.get(id=sent[3].id).step_id == WorkflowStep.objects.get(workflow_id=later.id).id
    assert Workflow.objects.get(id=later.id).state == "succeeded"
    assert Workflow.objects.get(id=w.id).state == "running"
    assert waits.send_events([(EVENT, "b", None)])[0].matched
    assert Workflow.objects.get(id=w.id).state == "succeeded"


def test_a_batch_in_a_rolled_back_transaction_wakes_nothing():
    w = waiting(["r"])
    with pytest.raises(RuntimeError), transaction.atomic():
        assert waits.send_events([(EVENT, "r", 1)])[0].matched
        raise RuntimeError("roll back")
    assert not WorkflowEvent.objects.exists()
    assert WorkflowStep.objects.get(workflow_id=w.id).state == "queued"


@pytest.mark.parametrize(
    ("bad", "message"),
    [((EVENT, "k" * 201, None), "bad event key"), (("", "k", None), "bad event name"), ((EVENT, "k", {1j}), "JSON")],
)
def test_one_bad_event_refuses_the_batch_and_writes_nothing(bad, message):
    waiting(["k"])
    with pytest.raises(WorkflowError, match=message):
        waits.send_events([(EVENT, "k", {"ok": True}), bad])
    assert not WorkflowEvent.objects.exists()
    assert waits.send_events([]) == []
