"""The webhooks layer as an app of its own (queue_app.webhooks, issue 45): installed with its label, registered
on the core's events (queue_app/events.py), which the queue, workflows and datasets publish with; without it an
event is checked and goes nowhere. (Without the core, `check` says so: test_datasets_app.py checks both layer
apps' jobsite.E100.)"""

import pytest
from django.apps import apps
from django.db import transaction

from queue_app import engine, events, hooks, services
from queue_app.webhooks.events import publish_event
from queue_app.webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def subscribed():
    """An endpoint subscribed to the queue's pause and resume and to test events (nothing is sent: no worker)."""
    engine.ensure_queue("default")
    return WebhookEndpoint.objects.create(
        url="https://93.184.216.34/in",
        event_types=["queue.paused", "queue.resumed", "test"],
        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )


def test_the_webhooks_app_is_installed_with_its_label_and_registers_on_the_cores_events():
    config = apps.get_app_config("jobsite_webhooks")
    assert (config.name, config.verbose_name) == ("queue_app.webhooks", "Webhooks")
    assert list(hooks.event_published) == [publish_event]


def test_the_cores_events_reach_the_endpoints_in_the_publishing_transaction(subscribed):
    services.pause_queue("default", actor="alice")  # the core publishes queue.paused through events.publish
    (paused,) = WebhookDelivery.objects.filter(event_type="queue.paused")
    assert paused.endpoint_id == subscribed.id and '"by":"alice"' in paused.body

    with transaction.atomic():
        (made,) = events.publish("test", {"n": 1})
        assert WebhookDelivery.objects.filter(pk=made.pk).exists()
        transaction.set_rollback(True)
    assert not WebhookDelivery.objects.filter(event_type="test").exists()  # rolled back with the caller


def test_without_the_app_an_event_is_checked_and_goes_nowhere(subscribed):
    hooks.event_published.unregister(publish_event)
    try:
        assert events.publish("test", {"n": 1}) == []
        with pytest.raises(events.InvalidEvent, match="unknown event type 'no.such'"):
            events.publish("no.such", {})
        with pytest.raises(events.InvalidEvent, match="event data"):
            events.publish("test", {"not json": object()})
    finally:
        hooks.event_published.register(publish_event)
    assert not WebhookDelivery.objects.exists()
