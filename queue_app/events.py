"""jobsite's events: what happened (a queue paused, a schedule's fire missed, a dataset gone stale, a workflow's
end...), published inside the caller's transaction to the apps that deliver them.

    from queue_app import events

    with transaction.atomic():
        order.save()
        events.publish("test", {"order": order.id})  # delivered only if this transaction commits

The core names the event types (EVENT_TYPES, the vocabulary every app publishes with: names only, no layer is
imported) and calls the functions registered on `hooks.event_published`, in the caller's transaction. The
webhooks app (queue_app.webhooks) registers one: a delivery per endpoint subscribed to the type. With no app
registered an event is checked and goes nowhere.

Events raised inside SQL (a dead letter, a lost worker, an item done or failed, a workflow's approval request)
take one more hop: a trigger queues an item of PUBLISH_TASK, the webhooks app's task, only when one of its
endpoints subscribes to the type, and that item's transactional handler publishes it.
"""

from __future__ import annotations

from typing import Any

from . import hooks
from .engine.alias import atomic
from .engine.errors import InvalidEnqueue
from .engine.payload import encode_json

PUBLISH_TASK = "queue_app.webhook_publish"

# type -> what it says. Workflow events are published by the workflow engine; `test` by the admin, the CLI and
# anyone's code.
EVENT_TYPES: dict[str, str] = {
    "test": "A test or custom event (admin 'send test event', `webhooks test`, your own code).",
    "item.dead_lettered": "A queue item became a dead letter (its last attempt failed, or it was poison).",
    "item.done": "A queue item finished (opt-in per queue on the endpoint: one event per item).",
    "item.failed": "An attempt at a queue item failed (retried or dead; opt-in per queue on the endpoint).",
    "spark_run.finished": "A Spark run ended: succeeded, failed, cancelled or timed_out (data.outcome).",
    "workflow.finished": "A workflow ended succeeded or cancelled (data.state says which).",
    "workflow.failed": "A workflow failed: a step failed for good.",
    "workflow.approval_requested": "A workflow's approval step started waiting for a decision (data.step).",
    "dataset.stale": "A dataset went past its freshness policy (once per episode: data.overdue_since).",
    "schedule.fire_missed": "A schedule skipped a fire time it was too late for (catch-up 'skip').",
    "queue.paused": "A queue was paused.",
    "queue.resumed": "A queue was resumed.",
    "worker.lost": "A worker stopped heartbeating without saying goodbye (marked stopped by maintenance).",
    "webhook_endpoint.disabled": "A webhook endpoint was disabled after failing continuously.",
}


class InvalidEvent(ValueError):
    """An event of an unknown type, or data that cannot be sent."""


def checked(event_type: str, data: Any) -> Any:
    """The event's data (`{}` for None) once its type is known and its data encodes as JSON; InvalidEvent if not."""
    if event_type not in EVENT_TYPES:
        raise InvalidEvent(f"unknown event type {event_type!r}; known: {', '.join(EVENT_TYPES)}")
    data = {} if data is None else data
    try:
        encode_json(data, "event data")
    except InvalidEnqueue as exc:
        raise InvalidEvent(str(exc)) from None
    return data


def publish(event_type: str, data: Any = None) -> list[Any]:
    """Publish an event to every app registered on it, in the caller's transaction (one of its own when there is
    none): what each made (the webhooks app: its deliveries), or nothing when no app listens. InvalidEvent for
    an unknown type or data that is not JSON, before anything is written."""
    data = checked(event_type, data)
    with atomic():
        return [made for publish_to in hooks.event_published for made in publish_to(event_type, data)]
