"""Webhook tables: endpoints (where events go, with their secrets), deliveries (one message to one endpoint,
carried by one queue item), attempts (one HTTP request each) and received ids (the receiving side's replay
guard). Rows are written by the webhooks service functions (queue_app/webhooks/services.py) and the delivery
task; the admin only reads them.

A delivery's state is its queue item's: ready or reserved = pending, done = delivered, dead = failed. Nothing is
copied, so nothing can disagree; `delivered_at` keeps the answer once the done item is pruned.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

# The models of the webhooks app (label jobsite_webhooks); their tables keep the names the core's migrations gave
# them (queue_app_*, `db_table`): queue_app 0047 and this app's 0001 moved the models' state only.
APP_LABEL = "jobsite_webhooks"


class WebhookEndpoint(models.Model):
    id = models.BigAutoField(primary_key=True)
    url = models.CharField(max_length=2000, help_text="http(s) URL the events are POSTed to.")
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = models.JSONField(default=list, help_text="Event types this endpoint receives.")
    item_event_queues = models.JSONField(
        default=list,
        blank=True,
        help_text="item.done / item.failed come only from these queues (opt-in per queue: one event per item).",
    )
    enabled = models.BooleanField(default=True)
    ordered = models.BooleanField(
        default=False, help_text="Deliver one message at a time in publish order (a retry blocks the ones after it)."
    )
    rate_limit = models.FloatField(null=True, blank=True, help_text="Most requests per second; empty = no limit.")
    # Standard Webhooks secrets ("whsec_" + base64). During a rotation both sign until previous_secret_until.
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True, default="")
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    # The rate limiter's clock: the earliest time the next request may start (claimed by UPDATE ... RETURNING,
    # so workers on many hosts share it).
    next_send_at = models.DateTimeField(null=True, blank=True)
    failing_since = models.DateTimeField(
        null=True, blank=True, help_text="First failed attempt since the last success (empty: healthy)."
    )
    disabled_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_webhookendpoint"
        ordering = ["id"]
        permissions = [
            ("send_test_webhookendpoint", "Can send test events to webhook endpoints"),
            ("rotate_secret_webhookendpoint", "Can rotate webhook endpoint secrets"),
        ]

    def __str__(self) -> str:
        return f"endpoint {self.id}: {self.url}"


class WebhookDelivery(models.Model):
    """One message for one endpoint. `webhook_id` is the Standard Webhooks `webhook-id`: the same on every
    attempt and replay, the receiver's idempotency key."""

    id = models.BigAutoField(primary_key=True)
    webhook_id = models.CharField(max_length=64, unique=True)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=100)
    body = models.TextField(help_text="The JSON body as sent (signed byte for byte).")
    item_id = models.BigIntegerField(null=True, blank=True, help_text="The queue item that carries it.")
    created_at = models.DateTimeField(db_default=Now())
    attempt_count = models.PositiveIntegerField(default=0)
    last_status_code = models.IntegerField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_webhookdelivery"
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        permissions = [("replay_webhookdelivery", "Can replay webhook deliveries")]
        indexes = [
            models.Index("endpoint", models.F("id").desc(), name="webhookdelivery_endpoint"),
            models.Index("item_id", name="webhookdelivery_item", condition=Q(item_id__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.webhook_id}"


class WebhookAttempt(models.Model):
    """One HTTP request of a delivery (or the reason none was made)."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempts")
    attempt = models.PositiveIntegerField()
    reservation_id = models.BigIntegerField(null=True, blank=True)
    status_code = models.IntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="", help_text="Truncated.")
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_webhookattempt"
        ordering = ["-id"]
        indexes = [models.Index("delivery", "id", name="webhookattempt_delivery")]

    def __str__(self) -> str:
        return f"delivery {self.delivery_id}, attempt {self.attempt}: {self.status_code or self.error[:60]}"

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300
