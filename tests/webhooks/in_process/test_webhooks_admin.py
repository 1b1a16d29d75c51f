"""Webhooks in the admin: the add form refuses bad input field by field and shows the secret once; send test
event, rotate, enable/disable and replay are permissioned actions that write LogEntries; "replay failed since"
goes through a confirmation page that counts first; the secret never appears on any page."""

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from queue_app.models import ItemState, QueueItem
from queue_app.webhooks import services as webhooks
from queue_app.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    action_post,
    detail_action_post,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    url,
)

pytestmark = pytest.mark.django_db

VIEWS = ["view_webhookendpoint", "view_webhookdelivery"]


@pytest.fixture
def client_with(django_user_model):
    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(username="staff", password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label__in=JOBSITE_LABELS, codename__in=[*VIEWS, *codenames])
        )
        client = Client()
        client.force_login(user)
        return client

    return make


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def add_form(**fields) -> dict:
    return {
        "url": "https://example.com/hook",
        "event_types": ["test"],
        "description": "",
        "enabled": "on",
        "item_event_queues": "",
        "rate_limit": "",
        **fields,
    }


def test_adding_an_endpoint_shows_its_secret_once_and_never_again(client_with):
    client = client_with("add_webhookendpoint", "change_webhookendpoint")
    response = client.post(url("webhookendpoint", "add"), add_form(), follow=True)
    endpoint = WebhookEndpoint.objects.get()
    (message,) = [m for m in messages_of(response) if "Secret of endpoint" in m]
    assert endpoint.secret in message and "not shown again" in message
    assert LogEntry.objects.filter(action_flag=ADDITION, object_id=str(endpoint.pk)).exists()
    for page in (url("webhookendpoint"), url("webhookendpoint", "change", endpoint.pk)):
        assert endpoint.secret not in client.get(page).content.decode()


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"url": "ftp://example.com/"}, "url", "only http and https"),
        ({"url": "http://127.0.0.1/"}, "url", "loopback"),
        ({"url": "http://169.254.169.254/latest/"}, "url", "link-local"),
        ({"event_types": ["nope"]}, "event_types", "Select a valid choice"),
        ({"event_types": []}, "event_types", "required"),
        ({"rate_limit": "-1"}, "rate_limit", "requests per second"),
        ({"item_event_queues": "webhooks"}, "item_event_queues", "carries the webhooks"),
    ],
)
def test_bad_endpoint_input_gives_a_form_error_on_its_field_and_writes_nothing(client_with, fields, field, message):
    client = client_with("add_webhookendpoint")
    response = client.post(url("webhookendpoint", "add"), add_form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors[field])
    assert not WebhookEndpoint.objects.exists()


def test_send_test_event_needs_its_permission_and_queues_one_delivery(client_with):
    endpoint = webhooks.create_endpoint("https://example.com/hook", ["queue.paused"]).endpoint
    refused = client_with().post(url("webhookendpoint"), action_post("send_test", endpoint.pk))
    assert refused.status_code == 403 and not WebhookDelivery.objects.exists()


def test_send_test_event_from_the_detail_page(client_with):
    endpoint = webhooks.create_endpoint("https://example.com/hook", ["queue.paused"]).endpoint
    client = client_with("send_test_webhookendpoint")
    response = client.post(
        url("webhookendpoint", "change", endpoint.pk), detail_action_post("send_test", endpoint.pk), follow=True
    )
    (delivery,) = WebhookDelivery.objects.all()
    assert delivery.event_type == "test" and delivery.endpoint_id == endpoint.pk
    assert any("Queued a test event to 1" in m for m in messages_of(response))
    assert LogEntry.objects.filter(action_flag=CHANGE, object_id=str(endpoint.pk)).exists()


def test_rotating_shows_the_new_secret_once_and_keeps_the_old_one_signing(client_with):
    created = webhooks.create_endpoint("https://example.com/hook", ["test"])
    client = client_with("rotate_secret_webhookendpoint")
    response = client.post(url("webhookendpoint"), action_post("rotate_secret", created.endpoint.pk), follow=True)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret != created.secret and endpoint.previous_secret == created.secret
    assert endpoint.previous_secret_until > timezone.now()
    assert any(endpoint.secret in m for m in messages_of(response))


def test_an_automatically_disabled_endpoint_says_why_on_its_page(client_with):
    endpoint = webhooks.create_endpoint("https://example.com/hook", ["test"]).endpoint
    webhooks.disable_endpoint(endpoint, reason="disabled automatically: every attempt failed since ...")
    response = client_with().get(url("webhookendpoint", "change", endpoint.pk))
    assert "disabled automatically" in response.content.decode()


def failed_delivery(endpoint) -> WebhookDelivery:
    (delivery,) = webhooks.send_test_event([endpoint.pk])
    QueueItem.objects.filter(id=delivery.item_id).update(state=ItemState.DEAD, finished_at=timezone.now())
    return delivery


def test_replay_failed_since_counts_on_a_confirmation_page_then_replays(client_with):
    endpoint = webhooks.create_endpoint("https://example.com/hook", ["test"]).endpoint
    since = timezone.now()
    failed = [failed_delivery(endpoint) for _ in range(2)]
    webhooks.send_test_event([endpoint.pk])  # pending: not replayed
    client = client_with("replay_webhookdelivery")
    chosen = client.post(url("webhookdelivery", "replay_since"), {"since": since.strftime("%Y-%m-%d %H:%M:%S")})
    assert chosen.status_code == 302 and "state=failed" in chosen["location"]
    page = client.get(chosen["location"])
    assert page.status_code == 200 and "<strong>2</strong>" in page.content.decode()
    assert QueueItem.objects.filter(state=ItemState.DEAD).count() == 2  # nothing happened yet
    client.post(chosen["location"])
    assert not QueueItem.objects.filter(id__in=[d.item_id for d in failed], state=ItemState.DEAD).exists()
    assert webhooks.delivery_states(failed) == {d.id: "pending" for d in failed}


def test_replay_needs_its_permission(client_with):
    endpoint = webhooks.create_endpoint("https://example.com/hook", ["test"]).endpoint
    delivery = failed_delivery(endpoint)
    client = client_with()
    assert client.post(url("webhookdelivery"), action_post("replay", delivery.pk)).status_code == 403
    assert client.get(url("webhookdelivery", "replay_since")).status_code == 403
    assert webhooks.delivery_states([delivery]) == {delivery.id: "failed"}


def test_delivery_pages_list_state_and_show_every_attempt(client_with):
    endpoint = webhooks.create_endpoint("https://example.com/hook", ["test"]).endpoint
    delivery = failed_delivery(endpoint)
    client = client_with()
    listing = client.get(url("webhookdelivery"), {"state": "failed"}).content.decode()
    assert delivery.webhook_id in listing and "failed" in listing
    detail = client.get(url("webhookdelivery", "change", delivery.pk)).content.decode()
    assert delivery.webhook_id in detail and "jobsite test event" in detail
    # A since that is not a time is refused as an incorrect lookup (Django's admin redirects to ?e=1), not
    # listed unfiltered as if it were a time.
    refused = client.get(url("webhookdelivery"), {"since": "not a time"})
    assert (refused.status_code, refused["location"]) == (302, url("webhookdelivery") + "?e=1")
