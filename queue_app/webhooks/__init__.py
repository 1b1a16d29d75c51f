"""Webhooks: jobsite's events, signed (Standard Webhooks) and delivered by jobsite's own queue. An app of its own
(apps.py): `INSTALLED_APPS += ["queue_app.webhooks"]` after `queue_app`.

    from queue_app import events

    with transaction.atomic():
        order.save()
        events.publish("test", {"order": order.id})  # sent only if this transaction commits

Modules: apps (the app, registered on the core's events), models (tables), events (publish_event: the
deliveries of an event), targets (where a webhook may go), sender (sign and POST one attempt), tasks (the
built-in tasks), triggers (events raised in SQL), services (endpoint and delivery changes), admin, and the
`webhooks` command. The receiving side is the core's (queue_app/receiver.py).

`from queue_app.webhooks import publish_event` (and EVENT_TYPES, InvalidEvent) still works: the names are looked
up when first used, since Django imports this package before its models may load.
"""

from typing import Any

__all__ = ["EVENT_TYPES", "InvalidEvent", "publish_event"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import events

        return getattr(events, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
