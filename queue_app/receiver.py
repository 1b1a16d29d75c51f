"""The receiving side, for a Django project that consumes jobsite webhooks (another jobsite, or any project with
queue_app installed for the replay table):

    from queue_app.receiver import webhook_receiver

    @webhook_receiver(secrets=[os.environ["JOBSITE_WEBHOOK_SECRET"]])
    def on_event(request, event):
        ...  # event = {"type": ..., "timestamp": ..., "data": ...}; return a response or None (204)

The signature is checked by the `standardwebhooks` library (any of the given secrets: list the old and the new
one while you rotate), the timestamp must be within `tolerance` seconds of now (at most the library's 5
minutes), and a webhook-id seen before is refused (409) so a replayed request runs nothing twice. Missing or
malformed headers or body get 400, a bad signature 401, a stale timestamp 401 with its own message. A redelivery
after a lost answer reuses its webhook-id too: it gets 409, which the sender counts as failed, so answer 2xx
before doing slow work or let the redelivery run (`reject_replays=False`) and deduplicate by id yourself.
"""

import base64
import binascii
import functools
import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from .engine.alias import atomic, queue_db
from .models import ReceivedWebhook

DEFAULT_TOLERANCE = 300.0
# standardwebhooks refuses a timestamp more than 5 minutes away whatever we allow: a larger tolerance would turn
# a stale request into the library's "no matching signature", so it is refused where it is set.
LIBRARY_TOLERANCE = 300.0
TIMESTAMP = re.compile(r"[0-9]{1,12}")  # integer seconds since the epoch, as the specification writes it


class RejectedWebhook(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def check_tolerance(tolerance: float) -> None:
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance <= LIBRARY_TOLERANCE:
        raise ValueError(f"tolerance must be seconds in (0, {LIBRARY_TOLERANCE:g}], not {tolerance!r}")


def _header(headers: dict[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise RejectedWebhook(400, f"missing {name} header")
    return value


def _check_signature_header(value: str) -> None:
    """Each space-separated entry is `version,base64`; v1 entries must decode (the library would raise on them)."""
    for entry in value.split(" "):
        version, comma, signature = entry.partition(",")
        if not comma or not version or "," in signature:
            raise RejectedWebhook(400, f"malformed webhook-signature: {entry[:40]!r} is not version,signature")
        if version == "v1":
            try:
                base64.b64decode(signature, validate=True)
            except binascii.Error:
                raise RejectedWebhook(400, f"malformed webhook-signature: {entry[:40]!r} is not base64") from None


def verify(
    body: bytes, headers: dict[str, str], secrets: Iterable[str], *, tolerance: float = DEFAULT_TOLERANCE
) -> dict[str, Any]:
    """The verified event, or RejectedWebhook: 400 for missing or malformed headers or body, 401 for a stale
    timestamp (its own message: a clock or a late redelivery, not a secret, is to blame) or a bad signature."""
    check_tolerance(tolerance)
    headers = {k.lower(): v for k, v in headers.items()}
    _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    if not TIMESTAMP.fullmatch(stamp):
        raise RejectedWebhook(400, f"malformed webhook-timestamp {stamp[:40]!r}: expected integer seconds since 1970")
    _check_signature_header(_header(headers, "webhook-signature"))
    age = time.time() - int(stamp)
    if abs(age) > tolerance:
        when = "old" if age > 0 else "in the future"
        raise RejectedWebhook(
            401, f"stale webhook-timestamp: {abs(age):.0f}s {when} (tolerance {tolerance:g}s); check the clocks"
        )
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise RejectedWebhook(400, "the body is not UTF-8") from None
    for secret in secrets:
        try:
            Webhook(secret).verify(text, headers, json_parse=False)
        except WebhookVerificationError:
            continue
        try:
            event = json.loads(text)
        except ValueError:
            raise RejectedWebhook(400, "the body is not JSON") from None
        if not isinstance(event, dict) or "type" not in event:
            raise RejectedWebhook(400, "the body is not a Standard Webhooks event")
        return event
    raise RejectedWebhook(401, "no valid signature (wrong secret, or the body was changed)")


def claim_once(webhook_id: str, *, using: str | None = None) -> bool:
    """Record `webhook_id` as received; False when it was received before (a replay). Its unique key decides:
    a concurrent claim of the same id waits for this transaction, then finds it (or, rolled back, takes it)."""
    try:
        with atomic(using):
            ReceivedWebhook.objects.using(queue_db(using)).create(webhook_id=webhook_id[:200])
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
    check_tolerance(tolerance)

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
            with atomic():
                if reject_replays and not claim_once(webhook_id):
                    return JsonResponse({"error": f"webhook-id {webhook_id} was received before"}, status=409)
                response = view(request, event)
            return response if response is not None else HttpResponse(status=204)

        return receive

    return decorate
