"""Issue 41: debounce (an item's debounce key, the latest due time a debounce may push it to, the enqueues it
absorbed; the unique index of a key's one ready, never leased item, which the enqueue's upsert finds) and priority
aging (a queue's aging rate)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0034_item_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="itemhistory",
            name="absorbed",
            field=models.PositiveIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="itemhistory",
            name="debounce_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="itemhistory",
            name="debounce_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="aging_rate",
            field=models.FloatField(
                blank=True,
                help_text="Priority points per second a due item gains while it waits; empty = no aging.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queueitem",
            name="absorbed",
            field=models.PositiveIntegerField(
                db_default=0,
                help_text="Enqueues of its debounce key this item absorbed (their payloads replaced its own).",
            ),
        ),
        migrations.AddField(
            model_name="queueitem",
            name="debounce_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="queueitem",
            name="debounce_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(("aging_rate__isnull", True), ("aging_rate__gt", 0), _connector="OR"),
                name="queue_aging_rate_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="queueitem",
            constraint=models.UniqueConstraint(
                models.F("queue"),
                models.F("debounce_key"),
                condition=models.Q(("debounce_key__isnull", False), ("reservation__isnull", True), ("state", "ready")),
                name="item_debounce_ready",
            ),
        ),
    ]
