"""The webhooks app's models, moved from the core app (queue_app 0047) with their tables as they are: this
migration only tells Django's state they are this app's (SeparateDatabaseAndState, no SQL on the tables, whose
names `db_table` keeps), and relabels their content types from queue_app to jobsite_webhooks, keeping their ids (granted
permissions and admin log entries stay attached; queue_app/relabel.py). Backwards: the content types go back to
queue_app, the tables are not touched."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

from queue_app.relabel import relabel_migration

MODELS = ("webhookendpoint", "webhookdelivery", "webhookattempt")
relabel, relabel_back = relabel_migration("queue_app", "jobsite_webhooks", MODELS)

STATE = [
    migrations.CreateModel(
        name="WebhookEndpoint",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("url", models.CharField(help_text="http(s) URL the events are POSTed to.", max_length=2000)),
            ("description", models.CharField(blank=True, default="", max_length=200)),
            ("event_types", models.JSONField(default=list, help_text="Event types this endpoint receives.")),
            (
                "item_event_queues",
                models.JSONField(
                    blank=True,
                    default=list,
                    help_text="item.done / item.failed come only from these queues (opt-in per queue: one event per item).",
                ),
            ),
            ("enabled", models.BooleanField(default=True)),
            (
                "ordered",
                models.BooleanField(
                    default=False,
                    help_text="Deliver one message at a time in publish order (a retry blocks the ones after it).",
                ),
            ),
            (
                "rate_limit",
                models.FloatField(blank=True, help_text="Most requests per second; empty = no limit.", null=True),
            ),
            ("secret", models.CharField(max_length=100)),
            ("previous_secret", models.CharField(blank=True, default="", max_length=100)),
            ("previous_secret_until", models.DateTimeField(blank=True, null=True)),
            ("next_send_at", models.DateTimeField(blank=True, null=True)),
            (
                "failing_since",
                models.DateTimeField(
                    blank=True, help_text="First failed attempt since the last success (empty: healthy).", null=True
                ),
            ),
            ("disabled_reason", models.TextField(blank=True, default="")),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ],
        options={
            "db_table": "queue_app_webhookendpoint",
            "ordering": ["id"],
            "permissions": [
                ("send_test_webhookendpoint", "Can send test events to webhook endpoints"),
                ("rotate_secret_webhookendpoint", "Can rotate webhook endpoint secrets"),
            ],
        },
    ),
    migrations.CreateModel(
        name="WebhookDelivery",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("webhook_id", models.CharField(max_length=64, unique=True)),
            ("event_type", models.CharField(max_length=100)),
            ("body", models.TextField(help_text="The JSON body as sent (signed byte for byte).")),
            ("item_id", models.BigIntegerField(blank=True, help_text="The queue item that carries it.", null=True)),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("attempt_count", models.PositiveIntegerField(default=0)),
            ("last_status_code", models.IntegerField(blank=True, null=True)),
            ("delivered_at", models.DateTimeField(blank=True, null=True)),
            (
                "endpoint",
                models.ForeignKey(
                    on_delete=django.db.models.deletion.CASCADE,
                    related_name="deliveries",
                    to="jobsite_webhooks.webhookendpoint",
                ),
            ),
        ],
        options={
            "verbose_name_plural": "webhook deliveries",
            "db_table": "queue_app_webhookdelivery",
            "ordering": ["-id"],
            "permissions": [("replay_webhookdelivery", "Can replay webhook deliveries")],
        },
    ),
    migrations.CreateModel(
        name="WebhookAttempt",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("attempt", models.PositiveIntegerField()),
            ("reservation_id", models.BigIntegerField(blank=True, null=True)),
            ("status_code", models.IntegerField(blank=True, null=True)),
            ("latency_ms", models.FloatField(blank=True, null=True)),
            ("response_body", models.TextField(blank=True, default="", help_text="Truncated.")),
            ("error", models.TextField(blank=True, default="")),
            ("started_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            (
                "delivery",
                models.ForeignKey(
                    on_delete=django.db.models.deletion.CASCADE,
                    related_name="attempts",
                    to="jobsite_webhooks.webhookdelivery",
                ),
            ),
        ],
        options={
            "db_table": "queue_app_webhookattempt",
            "ordering": ["-id"],
            "indexes": [models.Index(models.F("delivery"), models.F("id"), name="webhookattempt_delivery")],
        },
    ),
    migrations.AddIndex(
        model_name="webhookdelivery",
        index=models.Index(
            models.F("endpoint"), models.OrderBy(models.F("id"), descending=True), name="webhookdelivery_endpoint"
        ),
    ),
    migrations.AddIndex(
        model_name="webhookdelivery",
        index=models.Index(
            models.F("item_id"), condition=models.Q(("item_id__isnull", False)), name="webhookdelivery_item"
        ),
    ),
]


class Migration(migrations.Migration):
    initial = True

    dependencies = [("queue_app", "0047_layer_models_move")]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=STATE),
        migrations.RunPython(relabel, relabel_back, elidable=False),
    ]
