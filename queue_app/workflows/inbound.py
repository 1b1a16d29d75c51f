"""The inbound event endpoint (issue 39): `POST /events/<source>/` takes a Standard Webhooks request signed with
one of the source's secrets (JOBSITE WORKFLOW_EVENT_SOURCES) and sends its event to the workflows with
`send_event`, its id `<source>:<webhook-id>` (claimed in the transaction that stores it: a replay is a
duplicate, refused with 409, and sends nothing). The body is a Standard Webhooks event: `{"type": NAME,
"timestamp": ..., "data": {"key": KEY, "payload": ...}}`; the event's name is its type, the payload any JSON
value, or left out (null)."""

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ..conf import queue_settings
from ..receiver import DEFAULT_TOLERANCE, RejectedWebhook, verify
from .definition import WorkflowError
from .waits import send_event


def source_config(source: str) -> dict[str, Any] | None:
    """The source's settings, None for a source not configured; ImproperlyConfigured for one without secrets."""
    config = queue_settings.WORKFLOW_EVENT_SOURCES.get(source)
    if config is not None and not (isinstance(config, dict) and config.get("secrets")):
        raise ImproperlyConfigured(f"JOBSITE WORKFLOW_EVENT_SOURCES[{source!r}] needs a non-empty 'secrets' list")
    return config


def event_fields(event: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(name, key, payload) of a verified Standard Webhooks event; RejectedWebhook 400 when `data` is not an
    object with a `key` (name and key are checked by send_event)."""
    data = event.get("data")
    if not isinstance(data, dict) or "key" not in data:
        raise RejectedWebhook(400, 'the event\'s "data" must be an object with a "key" (and optionally a "payload")')
    return event["type"], data["key"], data.get("payload")


@csrf_exempt  # signed instead
@require_POST
def receive_event(request: HttpRequest, source: str) -> HttpResponse:
    config = source_config(source)
    if config is None:
        return JsonResponse({"error": f"unknown event source {source!r}"}, status=404)
    tolerance = config.get("tolerance", DEFAULT_TOLERANCE)
    try:
        event = verify(request.body, dict(request.headers), config["secrets"], tolerance=tolerance)
        name, key, payload = event_fields(event)
    except RejectedWebhook as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    webhook_id = request.headers["webhook-id"]
    try:
        # The event's id is its webhook-id, told apart per source (two sources may well use the same ids): a
        # replay is a duplicate, claimed by send_event in the transaction that would store it.
        sent = send_event(name, key, payload, id=f"{source}:{webhook_id}")
    except WorkflowError as exc:  # raised before the event is written
        return JsonResponse({"error": str(exc)}, status=400)
    if sent.duplicate:
        return JsonResponse({"error": f"webhook-id {webhook_id} was received before"}, status=409)
    return JsonResponse(
        {"event_id": sent.id, "matched": sent.matched, "step_id": sent.step_id, "workflow_id": sent.workflow_id}
    )
