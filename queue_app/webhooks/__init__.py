"""Webhooks: jobsite's events, signed (Standard Webhooks) and delivered by jobsite's own queue.

    from queue_app.webhooks import publish_event

    with transaction.atomic():
        order.save()
        publish_event("test", {"order": order.id})  # sent only if this transaction commits

Modules: models (tables), events (event types, publish_event), targets (where a webhook may go), sender (sign and
POST one attempt), delivery (the built-in tasks), triggers (events raised in SQL), services (endpoint and
delivery changes), receiver (the receiving side, for a Django project).
"""

from .events import EVENT_TYPES, InvalidEvent, publish_event

__all__ = ["EVENT_TYPES", "InvalidEvent", "publish_event"]
