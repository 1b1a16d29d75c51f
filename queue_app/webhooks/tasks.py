"""The built-in tasks that carry webhooks, on their own queue `webhooks`:

- `queue_app.webhook_deliver` ({"delivery": id}): one attempt at one delivery. A 2xx settles the item done in
  the transaction that records the attempt (registry.Settled: the delivery never reads delivered while pending);
  anything else raises, and the engine retries on the providers' schedule (immediately, then 5 s, 5 min, 30 min,
  2 h, 5 h, 10 h, 10 h) and then makes the item a dead letter. Fencing, lease expiry after a crash and the dead
  letters are the queue's own: the webhook-id stays the delivery's on every attempt. At-least-once: a worker
  killed after the receiver answered sends again, under the same webhook-id.
- `queue_app.webhook_publish` ({"type", "data"}): an event raised in SQL (triggers) fanned out to its
  subscribers, transactional, so the deliveries commit with the settle exactly once.
"""

import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models.functions import Now

from .. import engine
from ..conf import queue_settings
from ..engine.alias import atomic, connection
from ..engine.errors import StaleReservation
from ..events import PUBLISH_TASK
from ..registry import Context, Delivery, Retry, Settled, job
from . import sender
from .events import DELIVER_TASK, WEBHOOK_QUEUE, publish_event
from .models import WebhookDelivery, WebhookEndpoint

logger = logging.getLogger("jobsite.webhooks")

# Seconds before attempts 2..8: the first attempt is immediate (Svix's and Stripe-like providers' schedule).
RETRY_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
ATTEMPTS = len(RETRY_SCHEDULE) + 1
# A handler waits this long at most for its endpoint's rate-limit slot; a later slot hands the item back (its
# attempt not spent) to come back when the slot is due.
MAX_RATE_WAIT = 10.0


def hard_timeout() -> float:
    """WEBHOOKS_HARD_TIMEOUT, which must leave a delivery room for its slot wait, its connect and its read."""
    seconds = float(queue_settings.WEBHOOKS_HARD_TIMEOUT)
    needed = (
        MAX_RATE_WAIT + float(queue_settings.WEBHOOKS_CONNECT_TIMEOUT) + float(queue_settings.WEBHOOKS_READ_TIMEOUT)
    )
    if not seconds > needed:
        raise ImproperlyConfigured(
            f"JOBSITE WEBHOOKS_HARD_TIMEOUT={seconds:g}s leaves a delivery no room: it must be over the "
            f"{MAX_RATE_WAIT:g}s rate-limit wait plus WEBHOOKS_CONNECT_TIMEOUT and WEBHOOKS_READ_TIMEOUT "
            f"({needed:g}s in all)"
        )
    return seconds


class DeliveryFailed(Exception):
    """The endpoint did not answer 2xx (or could not be reached): the attempt failed, the item is retried."""


class Postponed(Exception):
    """The item was handed back to the queue to wait for its endpoint's rate-limit slot. The worker's settle of
    this attempt then finds the reservation no longer current and changes nothing (fencing)."""


# Claims the endpoint's next send slot when it is due within `max_wait` seconds: returns the seconds to wait.
_CLAIM_SLOT = """
UPDATE queue_app_webhookendpoint
SET next_send_at = GREATEST(next_send_at, clock_timestamp()) + make_interval(secs => 1.0 / rate_limit)
WHERE id = %(id)s AND rate_limit > 0
  AND COALESCE(next_send_at, '-infinity') <= clock_timestamp() + make_interval(secs => %(max_wait)s)
RETURNING GREATEST(0, extract(epoch FROM next_send_at - make_interval(secs => 1.0 / rate_limit)
                                          - clock_timestamp()))::float8
"""
_SLOT_DUE_IN = """
SELECT GREATEST(0, extract(epoch FROM next_send_at - clock_timestamp()))::float8 FROM queue_app_webhookendpoint
WHERE id = %(id)s
"""


def _wait_for_slot(endpoint: WebhookEndpoint, ctx: Context) -> None:
    if not endpoint.rate_limit:
        return
    with connection.cursor() as cur:
        cur.execute(_CLAIM_SLOT, {"id": endpoint.id, "max_wait": MAX_RATE_WAIT})
        row = cur.fetchone()
        if row is None:
            cur.execute(_SLOT_DUE_IN, {"id": endpoint.id})
            due_in = (cur.fetchone() or [MAX_RATE_WAIT])[0]
            with contextlib.suppress(StaleReservation):  # cancelled meanwhile: nothing to hand back
                engine.release(ctx, delay=max(1.0, due_in - MAX_RATE_WAIT / 2))
            raise Postponed(f"rate limit: next slot in {due_in:.1f}s; handed back without spending the attempt")
    if row[0] > 0:
        time.sleep(row[0])


def secrets_of(endpoint: WebhookEndpoint, now: datetime | None = None) -> list[str]:
    """The secrets that sign now: the current one, and the previous one until its rotation window ends."""
    now = now or datetime.now(UTC)
    signing = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_until and endpoint.previous_secret_until > now:
        signing.append(endpoint.previous_secret)
    return signing


# An attempt's row, its delivery's summary and its endpoint's health in one round trip. failing_since is
# written only when it changes (set by the first failure since a success, cleared by the next success). Returns
# whether the endpoint has now failed without a success for longer than the disable threshold.
_RECORD_ATTEMPT = """
WITH attempt AS (
    INSERT INTO queue_app_webhookattempt
        (delivery_id, attempt, reservation_id, status_code, latency_ms, response_body, error, started_at)
    VALUES (%(delivery)s, %(attempt)s, %(reservation)s, %(status_code)s, %(latency_ms)s, %(body)s, %(error)s, now())
), delivery AS (
    UPDATE queue_app_webhookdelivery
    SET attempt_count = attempt_count + 1, last_status_code = %(status_code)s,
        delivered_at = CASE WHEN %(ok)s THEN now() ELSE delivered_at END
    WHERE id = %(delivery)s
), health AS (
    UPDATE queue_app_webhookendpoint SET failing_since = CASE WHEN %(ok)s THEN NULL ELSE now() END
    WHERE id = %(endpoint)s AND (failing_since IS NULL) <> %(ok)s
)
SELECT COALESCE(bool_or(NOT %(ok)s AND enabled
                        AND failing_since < now() - make_interval(secs => %(disable_after)s)), false)
FROM queue_app_webhookendpoint WHERE id = %(endpoint)s
"""


def _record(delivery: WebhookDelivery, ctx: Context, result: sender.AttemptResult) -> None:
    """Record the attempt; disable the endpoint when it has failed for too long."""
    params = {
        "delivery": delivery.id,
        "endpoint": delivery.endpoint_id,
        "attempt": ctx.attempt,
        "reservation": ctx.reservation_id,
        "status_code": result.status_code,
        "latency_ms": result.latency_ms,
        "body": result.response_body,
        "error": result.error,
        "ok": result.ok,
        "disable_after": float(queue_settings.WEBHOOKS_DISABLE_AFTER_DAYS) * 86400,
    }
    with connection.cursor() as cur:
        cur.execute(_RECORD_ATTEMPT, params)
        failing_too_long = cur.fetchone()[0]
    if failing_too_long:
        with atomic():
            _disable_if_failing_too_long(delivery.endpoint_id)


def _disable_if_failing_too_long(endpoint_id: int) -> None:
    from .services import disable_endpoint

    days = float(queue_settings.WEBHOOKS_DISABLE_AFTER_DAYS)
    endpoint = (
        WebhookEndpoint.objects.select_for_update()
        .filter(id=endpoint_id, enabled=True, failing_since__lt=Now() - timedelta(days=days))
        .first()
    )
    if endpoint is not None:
        disable_endpoint(
            endpoint,
            reason=f"disabled automatically: every attempt failed since {endpoint.failing_since:%Y-%m-%d %H:%M} UTC "
            f"(more than {days:g} days without a success)",
        )


@job(
    DELIVER_TASK,
    queue=WEBHOOK_QUEUE,
    retry=Retry(times=ATTEMPTS, schedule=RETRY_SCHEDULE),
    hard_timeout=hard_timeout(),
)
def deliver(payload: Any, ctx: Context) -> dict[str, Any] | Settled:
    delivery = WebhookDelivery.objects.select_related("endpoint").filter(id=payload["delivery"]).first()
    if delivery is None:
        return {"skipped": "the delivery (or its endpoint) was deleted"}
    endpoint = delivery.endpoint
    if not endpoint.enabled:
        # Settled done without a request: a disabled endpoint gets nothing. Replay sends it once re-enabled.
        return {"skipped": "endpoint disabled"}
    _wait_for_slot(endpoint, ctx)
    result = sender.post(
        endpoint.url, delivery.body, sender.headers(secrets_of(endpoint), delivery.webhook_id, delivery.body)
    )
    done = {"status_code": result.status_code}
    if result.ok:  # the attempt's record (delivered_at) and the item's settle (the delivery's state) in one commit
        with atomic():
            _record(delivery, ctx, result)
            if engine.lock_reserved(ctx):
                engine.complete(ctx, done)
                return Settled(done)
        return done  # the reservation was lost meanwhile: recorded (it was sent), the worker's settle is stale
    _record(delivery, ctx, result)  # a failure: the state stays pending until the worker's settle (retry or dead)
    raise DeliveryFailed(result.error or f"HTTP {result.status_code}")


@job(PUBLISH_TASK, queue=WEBHOOK_QUEUE, delivery=Delivery.TRANSACTIONAL)
def publish(payload: Any, ctx: Context) -> dict[str, int]:
    deliveries = publish_event(payload["type"], payload.get("data"))
    return {"deliveries": len(deliveries)}
