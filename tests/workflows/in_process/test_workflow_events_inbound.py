"""The inbound event endpoint (issue 39): `POST /events/<source>/` verifies a Standard Webhooks signature with
the source's secret and sends the event to the workflows in the request's transaction, with the record of its
webhook-id; and the worker's drop_events unit drops the events no wait claimed within their lookback."""

import json
import logging
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from queue_app.models import ReceivedWebhook
from queue_app.webhooks.sender import headers
from queue_app.worker.maintenance import Maintenance, default_units, drop_events
from queue_app.worker.status import Stats
from queue_app.workflows import services, waits
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep
from tests.support.admin_fixtures import live_worker

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER = "whsec_" + "c2VjcmV0LW9mLXNvbWVib2R5LWVsc2U="
EVENT = "partner.callback"


@pytest.fixture(autouse=True)
def sources(settings):
    settings.JOBSITE = {"WORKFLOW_EVENT_SOURCES": {"partner": {"secrets": [SECRET]}}}


def post(client, body, *, secret=SECRET, webhook_id="msg_1", source="partner"):
    """POST `body` (JSON-encoded unless it is already text) signed now with `secret`."""
    text = body if isinstance(body, str) else json.dumps(body)
    signed = headers([secret], webhook_id, text)
    return client.post(
        f"/events/{source}/",
        text,
        content_type="application/json",
        headers={k: v for k, v in signed.items() if k != "content-type"},
    )


def event(key="o-1", payload=None, name=EVENT):
    return {"type": name, "timestamp": timezone.now().isoformat(), "data": {"key": key, "payload": payload}}


def waiting_graph(key: str) -> Workflow:
    g = Graph("inbound")
    g.wait_event("paid", event=EVENT, key=key, timeout=3600)
    w = services.start_graph(g)
    assert {s["name"]: s["state"] for s in services.status(w.id)["steps"]} == {"paid": "waiting_event"}
    return w


def test_a_signed_event_wakes_the_waiting_step_with_its_payload(client):
    w = waiting_graph("o-1")
    response = post(client, event("o-1", {"amount": 120}))
    assert response.status_code == 200, response.content
    step = WorkflowStep.objects.get(workflow_id=w.id, name="paid")
    assert response.json() == {
        "event_id": WorkflowEvent.objects.get().id,
        "matched": True,
        "step_id": step.id,
        "workflow_id": w.id,
    }
    assert step.state == "succeeded" and step.result == {"amount": 120}
    assert Workflow.objects.get(id=w.id).state == "succeeded"
    assert ReceivedWebhook.objects.filter(webhook_id="events:partner:msg_1").exists()


def test_an_event_nobody_waits_for_is_kept(client):
    response = post(client, event("o-2"))
    assert response.status_code == 200, response.content
    assert response.json()["matched"] is False
    assert WorkflowEvent.objects.get().step_id is None


def test_a_bad_signature_is_401_and_nothing_is_stored(client):
    w = waiting_graph("o-3")
    response = post(client, event("o-3"), secret=OTHER)
    assert response.status_code == 401
    assert "no valid signature" in response.json()["error"]
    assert not WorkflowEvent.objects.exists() and not ReceivedWebhook.objects.exists()
    assert WorkflowStep.objects.get(workflow_id=w.id, name="paid").state == "queued"


def test_a_replay_is_409_and_sends_nothing(client):
    first = post(client, event("o-4", {"n": 1}))
    assert first.status_code == 200, first.content
    again = post(client, event("o-4", {"n": 1}))
    assert again.status_code == 409
    assert "received before" in again.json()["error"]
    assert WorkflowEvent.objects.count() == 1


def test_an_unknown_source_is_404_and_nothing_is_written(client):
    response = post(client, event("o-5"), source="nobody")
    assert response.status_code == 404
    assert "unknown event source 'nobody'" in response.json()["error"]
    assert not WorkflowEvent.objects.exists() and not ReceivedWebhook.objects.exists()


def test_only_post(client):
    assert client.get("/events/partner/").status_code == 405


@pytest.mark.parametrize(
    "body, message",
    [
        ("not json", "the body is not JSON"),
        ({"data": {"key": "k"}}, "not a Standard Webhooks event"),
        ({"type": EVENT, "data": "k"}, '"data" must be an object with a "key"'),
        ({"type": EVENT, "data": {"payload": 1}}, '"data" must be an object with a "key"'),
        (event(name="n" * 201), "bad event name"),
        (event(key="k" * 201), "bad event key"),
        (event(key=7), "bad event key"),
    ],
)
def test_bad_bodies_are_400_with_a_clear_message_and_nothing_is_written(client, body, message):
    response = post(client, body)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert not WorkflowEvent.objects.exists() and not ReceivedWebhook.objects.exists()


def test_the_drop_unit_drops_unclaimed_events_past_their_lookback_and_keeps_the_rest(caplog):
    w = waiting_graph("claimed")
    claimed = waits.send_event(EVENT, "claimed", {"n": 1})
    old = [waits.send_event(EVENT, f"old-{i}") for i in range(3)]
    fresh = waits.send_event(EVENT, "fresh")
    assert claimed.matched and not any(e.matched for e in [*old, fresh])
    past = timezone.now() - timedelta(seconds=1)
    ended = WorkflowEvent.objects.filter(id__in=[claimed.id, *(e.id for e in old)])
    ended.update(created_at=F("created_at") - timedelta(days=2), expires_at=past)
    assert drop_events() == ({"dropped": 3}, False)
    assert set(WorkflowEvent.objects.values_list("id", flat=True)) == {claimed.id, fresh.id}
    assert WorkflowEvent.objects.get(id=claimed.id).step_id == WorkflowStep.objects.get(workflow_id=w.id).id
    assert drop_events() == ({"dropped": 0}, False)
    # Through the worker's maintenance (the unit every worker carries): its log line says how many were dropped,
    # and the worker's stats count them.
    gone = [waits.send_event(EVENT, f"gone-{i}") for i in range(2)]
    WorkflowEvent.objects.filter(id__in=[e.id for e in gone]).update(expires_at=past)
    stats = Stats()
    unit = next(u for u in default_units(scheduler=False, stats=stats) if u.name == "drop_events")
    with caplog.at_level(logging.INFO, logger="jobsite.worker"):
        Maintenance([unit]).run_due()
    assert "maintenance unit=drop_events dropped=2" in caplog.text
    assert stats.events_dropped == 2
    assert set(WorkflowEvent.objects.values_list("id", flat=True)) == {claimed.id, fresh.id}


def test_metrics_show_each_workers_dropped_events(client):
    live_worker("worker-1", queues=["mail"], stats={"processed": 7, "events_dropped": 4})
    text = client.get("/metrics").content.decode()
    assert 'jobsite_worker_events_dropped_total{worker="worker-1"} 4.0' in text
