"""`publish_event`: an event becomes one delivery (and one queue item) per enabled endpoint that subscribes to its
type, written in the caller's transaction, so nothing is sent if it rolls back. The app registers it on the
core's events (queue_app/events.py: the event types, and `events.publish`, which the core and the other layers
call), so every event the core publishes reaches it.

Events raised inside the engine's SQL (a dead letter, a lost worker, an item done or failed) take one more hop:
a trigger queues a `queue_app.webhook_publish` item only when an endpoint subscribes to the type (see
migration 0013_webhooks and triggers.py), and that item's transactional handler calls publish_event.
"""

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from ..engine.alias import atomic
from ..events import EVENT_TYPES, InvalidEvent, checked
from .models import WebhookDelivery, WebhookEndpoint

WEBHOOK_QUEUE = "webhooks"
DELIVER_TASK = "queue_app.webhook_deliver"

# Per-item events: an endpoint gets them only from the queues it names (item_event_queues).
ITEM_EVENTS = ("item.done", "item.failed")
MAX_EVENT_TYPE = 100


def check_event_types(types: Any) -> list[str]:
    """The event types as a clean list, or InvalidEvent saying which are unknown."""
    if isinstance(types, str) or not isinstance(types, (list, tuple)) or not types:
        raise InvalidEvent("give at least one event type")
    unknown = [t for t in types if not isinstance(t, str) or t not in EVENT_TYPES]
    if unknown:
        raise InvalidEvent(f"unknown event types: {', '.join(map(repr, unknown))}; known: {', '.join(EVENT_TYPES)}")
    return list(dict.fromkeys(types))


def new_webhook_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def message_body(event_type: str, data: Any, at: datetime | None = None) -> str:
    """The Standard Webhooks JSON body: type, timestamp, data."""
    at = at or datetime.now(UTC)
    return json.dumps(
        {"type": event_type, "timestamp": at.isoformat().replace("+00:00", "Z"), "data": data},
        separators=(",", ":"),
        sort_keys=True,
    )


def _subscribers(event_type: str, data: Any) -> list[WebhookEndpoint]:
    endpoints = WebhookEndpoint.objects.filter(enabled=True, event_types__contains=[event_type]).order_by("id")
    if event_type in ITEM_EVENTS:
        queue = data.get("queue") if isinstance(data, dict) else None
        endpoints = endpoints.filter(item_event_queues__contains=[queue])
    return list(endpoints)


def publish_event(event_type: str, data: Any = None) -> list[WebhookDelivery]:
    """Send `data` (JSON) as an event of `event_type` to every enabled endpoint subscribed to it.

    Runs in the caller's transaction: the deliveries and their queue items commit with it, or not at all. Returns
    the deliveries made (none when nobody subscribes). InvalidEvent for an unknown type or data that is not JSON.
    """
    data = checked(event_type, data)
    with atomic():
        endpoints = _subscribers(event_type, data)
        if not endpoints:
            return []
        body = message_body(event_type, data)
        return [enqueue_delivery(endpoint, event_type, body) for endpoint in endpoints]


def enqueue_delivery(endpoint: WebhookEndpoint, event_type: str, body: str) -> WebhookDelivery:
    """One delivery row and the queue item that carries it (ordered per endpoint when the endpoint asks)."""
    delivery = WebhookDelivery.objects.create(
        webhook_id=new_webhook_id(), endpoint=endpoint, event_type=event_type, body=body
    )
    delivery.item_id = enqueue_item(delivery, endpoint)
    delivery.save(update_fields=["item_id"])
    return delivery


def enqueue_item(delivery: WebhookDelivery, endpoint: WebhookEndpoint) -> int:
    from ..registry import get_task  # the registry imports the tasks modules, which import this one

    ordering_key = f"webhook-endpoint:{endpoint.id}" if endpoint.ordered else None
    return get_task(DELIVER_TASK).enqueue({"delivery": delivery.id}, ordering_key=ordering_key).id
