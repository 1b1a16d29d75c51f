"""The receiving side's replay guard (queue_app/receiver.py): one row per webhook-id received."""

from django.db import models
from django.db.models.functions import Now


class ReceivedWebhook(models.Model):
    """The receiving side's replay guard: a webhook-id seen once is refused again (queue_app.receiver)."""

    webhook_id = models.CharField(primary_key=True, max_length=200)
    received_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = "queue_app"
        indexes = [models.Index("received_at", name="receivedwebhook_at")]

    def __str__(self) -> str:
        return self.webhook_id
