"""Stored Spark scripts (the admin's) say which datasets they produce and consume, as jobs in code do (issue 38)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0025_sql_api"),
    ]

    operations = [
        migrations.AddField(
            model_name="sparkscript",
            name="consumes",
            field=models.JSONField(
                blank=True, default=dict, help_text='Datasets it reads: ["events"] or {"events": "day"}.'
            ),
        ),
        migrations.AddField(
            model_name="sparkscript",
            name="produces",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text='Datasets it writes: {"daily_revenue": "day"} (the param naming the partition) or ["rollup"].',
            ),
        ),
    ]
