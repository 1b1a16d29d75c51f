"""Expiries on the server's own clock (issue 49, gap 8), not by rewriting timestamps: an event's lookback and a
start key's window set short (half a second), the test waits until the database's now() has passed the row's
expiry (each statement its own transaction: transactional_db, so now() moves), then acts. The lookback ended: a
wait opened then does not take the event, and drop_expired_events drops it, at most `limit` a call, claimed and
fresh events kept. The window ended: the key starts a new workflow."""

import pytest
from django.db import connection

from queue_app.workflows import services, waits
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import WorkflowEvent, WorkflowStartKey, WorkflowStep
from tests.support.waiting import wait_for
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_diamond)

pytestmark = pytest.mark.django_db(transaction=True)
EVENT = "expiry.paid"
SHORT = 0.5  # seconds


def past(table: str, where: str, params: list) -> bool:
    """Whether the database's clock has passed the expires_at of every row of `table` matching `where`."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT bool_and(now() > expires_at) FROM {table} WHERE {where}", params)
        return bool(cur.fetchone()[0])


def waiting(key: str) -> int:
    g = Graph(f"waits for {key}")
    g.wait_event("paid", event=EVENT, key=key, timeout=3600)
    return services.start_graph(g).id


def test_a_lookback_that_ran_out_on_the_clock_matches_nothing_and_its_events_are_dropped_in_bounds(settings):
    settings.JOBSITE = {"WORKFLOW_EVENT_LOOKBACK": SHORT}
    old = [waits.send_event(EVENT, f"k{i}", {"i": i}).id for i in range(3)]
    claimed_by = waiting("claimed")
    claimed = waits.send_event(EVENT, "claimed").id  # ends its wait: kept with it, whatever its lookback
    wait_for(
        lambda: past("queue_app_workflowevent", "id = ANY(%s)", [[*old, claimed]]),
        30,
        what="the lookback to end",
        interval=0.05,
    )
    settings.JOBSITE = {"WORKFLOW_EVENT_LOOKBACK": 3600}
    fresh = waits.send_event(EVENT, "fresh").id

    late = waiting("k0")  # opened after k0's event ran out: does not take it
    assert WorkflowEvent.objects.get(id=old[0]).step_id is None
    assert services.status(late)["steps"][0]["state"] == "waiting_event"

    assert [waits.drop_expired_events(2), waits.drop_expired_events(2), waits.drop_expired_events(2)] == [2, 1, 0]
    assert set(WorkflowEvent.objects.values_list("id", flat=True)) == {claimed, fresh}
    assert WorkflowEvent.objects.get(id=claimed).step_id == WorkflowStep.objects.get(workflow_id=claimed_by).id


def test_a_key_window_that_ran_out_on_the_clock_starts_a_new_workflow():
    first = services.start("wf_diamond", key="k", key_window=SHORT)
    assert services.start("wf_diamond", key="k", key_window=SHORT).id == first.id  # inside the window
    assert WorkflowStartKey.objects.get(name="wf_diamond", key="k").expires_at is not None
    ended = lambda: past("queue_app_workflowstartkey", "name = %s AND key = %s", ["wf_diamond", "k"])  # noqa: E731
    wait_for(ended, 30, what="the window to end", interval=0.05)
    second = services.start("wf_diamond", key="k")
    assert second.created and second.id != first.id
