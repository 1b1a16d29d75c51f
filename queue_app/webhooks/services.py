"""One function per webhook state change, shared by the admin, the CLI and the delivery task: create, change,
enable or disable an endpoint, rotate its secret, send it a test event, replay deliveries. Bad input raises
EndpointInvalid with one message per field and writes nothing.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from .. import services as queue_services
from ..engine.alias import atomic
from ..engine.enqueue import QUEUE_NAME
from ..models import ItemHistory, ItemState, QueueItem
from .events import (
    EVENT_TYPES,
    ITEM_EVENTS,
    WEBHOOK_QUEUE,
    InvalidEvent,
    check_event_types,
    enqueue_delivery,
    enqueue_item,
    message_body,
    publish_event,
)
from .models import WebhookDelivery, WebhookEndpoint
from .sender import new_secret
from .targets import RefusedTarget, check_url

ROTATION_WINDOW = timedelta(hours=24)
MAX_DESCRIPTION = 200


class EndpointInvalid(ValueError):
    """{field: message} for every field that is wrong."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))


def endpoint_errors(
    *,
    url: Any = None,
    event_types: Any = None,
    description: Any = "",
    rate_limit: Any = None,
    item_event_queues: Any = (),
) -> dict[str, str]:
    """What is wrong with these endpoint fields (empty: nothing)."""
    errors = {}
    try:
        check_url(url)
    except RefusedTarget as exc:
        errors["url"] = str(exc)
    try:
        check_event_types(event_types)
    except InvalidEvent as exc:
        errors["event_types"] = str(exc)
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        errors["description"] = f"at most {MAX_DESCRIPTION} characters of text"
    if rate_limit is not None and (
        isinstance(rate_limit, bool)
        or not isinstance(rate_limit, (int, float))
        or not math.isfinite(rate_limit)
        or not 0.001 <= rate_limit <= 10_000
    ):
        errors["rate_limit"] = "requests per second between 0.001 and 10000, or empty for no limit"
    queues = list(item_event_queues or ())
    bad = [q for q in queues if not isinstance(q, str) or not QUEUE_NAME.match(q)]
    if bad:
        errors["item_event_queues"] = f"not queue names: {', '.join(map(repr, bad))}"
    elif WEBHOOK_QUEUE in queues:
        errors["item_event_queues"] = f"the {WEBHOOK_QUEUE!r} queue carries the webhooks themselves: no item events"
    return errors


@dataclass(frozen=True)
class Created:
    endpoint: WebhookEndpoint
    secret: str  # shown once, never again


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    errors = endpoint_errors(**{k: fields[k] for k in fields if k != "enabled" and k != "ordered"})
    if errors:
        raise EndpointInvalid(errors)
    fields = dict(fields)
    fields["event_types"] = check_event_types(fields["event_types"])
    fields["item_event_queues"] = list(dict.fromkeys(fields.get("item_event_queues") or ()))
    if fields.get("rate_limit") is not None:
        fields["rate_limit"] = float(fields["rate_limit"])
    return fields


def create_endpoint(
    url: str,
    event_types: Iterable[str],
    *,
    description: str = "",
    ordered: bool = False,
    rate_limit: float | None = None,
    item_event_queues: Iterable[str] = (),
    enabled: bool = True,
) -> Created:
    fields = _clean(
        {
            "url": url,
            "event_types": list(event_types) if not isinstance(event_types, str) else event_types,
            "description": description,
            "rate_limit": rate_limit,
            "item_event_queues": list(item_event_queues),
        }
    )
    secret = new_secret()
    with atomic():
        endpoint = WebhookEndpoint.objects.create(**fields, ordered=bool(ordered), enabled=bool(enabled), secret=secret)
        _item_events_changed()
    return Created(endpoint, secret)


def update_endpoint(endpoint_id: int, **changes: Any) -> WebhookEndpoint:
    """Change url, event_types, description, enabled, ordered, rate_limit or item_event_queues."""
    allowed = {"url", "event_types", "description", "enabled", "ordered", "rate_limit", "item_event_queues"}
    unknown = set(changes) - allowed
    if unknown:
        raise EndpointInvalid({name: "not a field that can be changed" for name in sorted(unknown)})
    with atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(id=endpoint_id)
        current = {name: getattr(endpoint, name) for name in allowed}
        fields = _clean({**current, **changes})
        for name, value in fields.items():
            setattr(endpoint, name, value)
        if changes.get("enabled"):
            endpoint.failing_since, endpoint.disabled_reason = None, ""
        endpoint.save()
        _item_events_changed()
    return endpoint


def set_enabled(endpoint_ids: Iterable[int], enabled: bool) -> int:
    with atomic():
        changed = WebhookEndpoint.objects.filter(id__in=list(endpoint_ids), enabled=not enabled)
        if enabled:
            count = changed.update(enabled=True, failing_since=None, disabled_reason="")
        else:
            count = changed.update(enabled=False)
        _item_events_changed()
    return count


def delete_endpoints(endpoint_ids: Iterable[int]) -> int:
    """Delete endpoints with their deliveries and attempts. Their queued items find no delivery and settle
    without a request."""
    with atomic():
        deleted = (
            WebhookEndpoint.objects.filter(id__in=list(endpoint_ids)).delete()[1].get(WebhookEndpoint._meta.label, 0)
        )
        _item_events_changed()
    return deleted


def disable_endpoint(endpoint: WebhookEndpoint, *, reason: str) -> None:
    """Disable an endpoint that kept failing, say why (shown in the admin) and publish the event."""
    with atomic():
        WebhookEndpoint.objects.filter(id=endpoint.id).update(enabled=False, disabled_reason=reason)
        _item_events_changed()
        publish_event(
            "webhook_endpoint.disabled",
            {
                "endpoint_id": endpoint.id,
                "url": endpoint.url,
                "failing_since": endpoint.failing_since.isoformat() if endpoint.failing_since else None,
                "reason": reason,
            },
        )


def rotate_secret(endpoint_id: int, *, window: timedelta = ROTATION_WINDOW) -> str:
    """A new secret signs from now on; the old one signs too until `window` has passed (receivers switch over
    meanwhile: each signature header carries both). Returns the new secret (shown once)."""
    secret = new_secret()
    with atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(id=endpoint_id)
        endpoint.previous_secret, endpoint.secret = endpoint.secret, secret
        endpoint.previous_secret_until = timezone.now() + window
        endpoint.save(update_fields=["secret", "previous_secret", "previous_secret_until"])
    return secret


def send_test_event(endpoint_ids: Iterable[int], data: Any = None) -> list[WebhookDelivery]:
    """A `test` event to each of these endpoints (enabled ones; subscribed to `test` or not)."""
    data = {"message": "jobsite test event"} if data is None else data
    body = message_body("test", data)
    with atomic():
        endpoints = WebhookEndpoint.objects.filter(id__in=list(endpoint_ids), enabled=True).order_by("id")
        return [enqueue_delivery(endpoint, "test", body) for endpoint in endpoints]


# -- deliveries -----------------------------------------------------------------------------------------------

STATE_OF_ITEM = {
    ItemState.READY: "pending",
    ItemState.RESERVED: "sending",
    ItemState.DONE: "delivered",
    ItemState.DEAD: "failed",
    ItemState.CANCELLED: "cancelled",
}


def delivery_states(deliveries: Iterable[WebhookDelivery]) -> dict[int, str]:
    """{delivery id: pending | sending | delivered | skipped | failed | cancelled} from the carrying items."""
    rows = list(
        WebhookDelivery.objects.filter(id__in=[d.id for d in deliveries]).values_list("id", "item_id", "delivered_at")
    )
    wanted = [item for _, item, _ in rows if item]
    items = dict(QueueItem.objects.filter(id__in=wanted).values_list("id", "state"))
    moved = [item for item in wanted if item not in items]  # finished and archived (engine/history.py)
    items.update(ItemHistory.objects.filter(id__in=moved).values_list("id", "state") if moved else [])
    states = {}
    for delivery_id, item_id, delivered_at in rows:
        item_state = items.get(item_id)
        if item_state is None:  # pruned: only a success leaves a mark
            states[delivery_id] = "delivered" if delivered_at else "unknown"
        elif item_state == ItemState.DONE and delivered_at is None:
            states[delivery_id] = "skipped"  # settled without a request: the endpoint was disabled
        else:
            states[delivery_id] = STATE_OF_ITEM[item_state]
    return states


def replay_deliveries(delivery_ids: Iterable[int], *, actor: str = "") -> int:
    """Send these deliveries again, under their own webhook-id: a failed one's dead item is requeued (attempts
    reset); a finished one gets a new item. Deliveries still pending, or of disabled endpoints, are left alone."""
    with atomic():
        deliveries = list(
            WebhookDelivery.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .filter(id__in=list(delivery_ids), endpoint__enabled=True)
        )
        states = delivery_states(deliveries)
        dead = [d.item_id for d in deliveries if states[d.id] == "failed"]
        replayed = queue_services.requeue_items(dead, actor=actor) if dead else 0
        for d in deliveries:
            if states[d.id] in ("delivered", "skipped", "cancelled", "unknown"):
                d.item_id = enqueue_item(d, d.endpoint)
                d.save(update_fields=["item_id"])
                replayed += 1
    return replayed


def failed_since(since: datetime, endpoint_id: int | None = None) -> list[int]:
    """Ids of the deliveries created since `since` whose item is a dead letter (optionally of one endpoint)."""
    deliveries = WebhookDelivery.objects.filter(created_at__gte=since)
    if endpoint_id is not None:
        deliveries = deliveries.filter(endpoint_id=endpoint_id)
    dead = QueueItem.objects.filter(state=ItemState.DEAD, queue_id=WEBHOOK_QUEUE).values("id")
    return list(deliveries.filter(item_id__in=dead).values_list("id", flat=True))


def _item_events_changed() -> None:
    """Endpoints changed: the item.done / item.failed trigger follows the queues that opt in (triggers.py)."""
    from .triggers import sync_item_event_trigger

    sync_item_event_trigger()


__all__ = [
    "EVENT_TYPES",
    "ITEM_EVENTS",
    "Created",
    "EndpointInvalid",
    "create_endpoint",
    "delete_endpoints",
    "delivery_states",
    "disable_endpoint",
    "endpoint_errors",
    "failed_since",
    "replay_deliveries",
    "rotate_secret",
    "send_test_event",
    "set_enabled",
    "update_endpoint",
]
