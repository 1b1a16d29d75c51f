"""The receiving side, for a Django project that consumes jobsite webhooks (another jobsite, or any project with
queue_app installed for the replay table):

    from queue_app.webhooks.receiver import webhook_receiver

    @webhook_receiver(secrets=[os.environ["JOBSITE_WEBHOOK_SECRET"]])
    def on_event(request, event):
        ...  # event = {"type": ..., "timestamp": ..., "data": ...}; return a response or None (204)

The signature is checked by the `standardwebhooks` library (any of the given secrets: list the old and the new
one while you rotate), the timestamp must be within `tolerance` seconds of now (at most the library's 5
minutes), and a webhook-id seen before is refused (409) so a replayed request runs nothing twice. A redelivery
after a lost answer reuses its webhook-id too: it gets 409, which the sender counts as failed, so answer 2xx
before doing slow work or let the redelivery run (`reject_replays=False`) and deduplicate by id yourself.
"""

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from .models import ReceivedWebhook

DEFAULT_TOLERANCE = 300.0


class RejectedWebhook(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def verify(
    body: bytes, headers: dict[str, str], secrets: Iterable[str], *, tolerance: float = DEFAULT_TOLERANCE
) -> dict[str, Any]:
    """The verified event, or RejectedWebhook (400: malformed, 401: bad signature or stale timestamp)."""
    headers = {k.lower(): v for k, v in headers.items()}
    stamp = headers.get("webhook-timestamp", "")
    try:
        age = abs(time.time() - float(stamp))
    except ValueError:
        raise RejectedWebhook(400, "missing or malformed webhook-timestamp") from None
    if age > tolerance:
        raise RejectedWebhook(401, f"webhook-timestamp is {age:.0f}s away from now (tolerance {tolerance:g}s)")
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise RejectedWebhook(400, "the body is not UTF-8") from None
    for secret in secrets:
        try:
            event = Webhook(secret).verify(text, headers)
        except WebhookVerificationError:
            continue
        except (ValueError, TypeError) as exc:  # malformed signature header
            raise RejectedWebhook(400, f"malformed webhook-signature: {exc}") from None
        if not isinstance(event, dict) or "type" not in event:
            raise RejectedWebhook(400, "the body is not a Standard Webhooks event")
        return event
    raise RejectedWebhook(401, "no valid signature (wrong secret, or the body was changed)")


def claim_once(webhook_id: str) -> bool:
    """Record `webhook_id` as received; False when it was received before (a replay)."""
    try:
        with transaction.atomic():
            ReceivedWebhook.objects.create(webhook_id=webhook_id[:200])
    except IntegrityError:
        return False
    return True


def webhook_receiver(
    *, secrets: Iterable[str], tolerance: float = DEFAULT_TOLERANCE, reject_replays: bool = True
) -> Callable[[Callable[..., Any]], Callable[[HttpRequest], HttpResponse]]:
    """Decorate `view(request, event)`: only verified, fresh, first-seen events reach it."""
    secrets = list(secrets)
    if not secrets:
        raise ValueError("webhook_receiver needs at least one secret")

    def decorate(view: Callable[..., Any]) -> Callable[[HttpRequest], HttpResponse]:
        @csrf_exempt
        @require_POST
        @functools.wraps(view)
        def receive(request: HttpRequest) -> HttpResponse:
            try:
                event = verify(request.body, dict(request.headers), secrets, tolerance=tolerance)
            except RejectedWebhook as exc:
                return JsonResponse({"error": str(exc)}, status=exc.status)
            webhook_id = request.headers["webhook-id"]
            with transaction.atomic():
                if reject_replays and not claim_once(webhook_id):
                    return JsonResponse({"error": f"webhook-id {webhook_id} was received before"}, status=409)
                response = view(request, event)
            return response if response is not None else HttpResponse(status=204)

        return receive

    return decorate
