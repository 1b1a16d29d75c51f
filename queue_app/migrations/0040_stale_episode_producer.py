"""What a staleness episode started of its dataset's producer (trigger_producer_when_stale: datasets/stale.py):
the partition, the runs or items started, an error. Rows written before stay as they were (nothing started)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0039_dataset_watch_schedule"),
    ]

    operations = [
        migrations.AddField(
            model_name="staleepisode",
            name="error",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="staleepisode",
            name="partition",
            field=models.CharField(blank=True, help_text="empty: no producer started", max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="staleepisode",
            name="started",
            field=models.JSONField(blank=True, default=list, help_text='what it started: ["spark_run:12"]'),
        ),
    ]
