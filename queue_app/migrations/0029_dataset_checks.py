"""Dataset checks (issue 38): a materialization's checks state, one result row per (materialization, check)
with the permission to override failed blocking checks, and the queue items parked until a partition they read
is usable (datasets/checks_run.py)."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0028_dataset_stale_episodes"),
    ]

    operations = [
        migrations.AddField(
            model_name="materialization",
            name="checks",
            field=models.CharField(
                choices=[
                    ("none", "None"),
                    ("pending", "Pending"),
                    ("passed", "Passed"),
                    ("warned", "Warned"),
                    ("failed", "Failed"),
                    ("overridden", "Overridden"),
                ],
                db_default="none",
                default="none",
                max_length=10,
            ),
        ),
        migrations.CreateModel(
            name="DatasetBlock",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("item_id", models.BigIntegerField()),
                ("spark_run_id", models.BigIntegerField(blank=True, null=True)),
                ("dataset", models.CharField(max_length=200)),
                ("partition", models.CharField(blank=True, default="", max_length=200)),
                ("materialization_id", models.BigIntegerField()),
                ("reason", models.TextField()),
                ("since", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "indexes": [models.Index(models.F("dataset"), models.F("partition"), name="dataset_block_partition")],
                "constraints": [
                    models.UniqueConstraint(fields=("item_id", "dataset", "partition"), name="dataset_block_once")
                ],
            },
        ),
        migrations.CreateModel(
            name="DatasetCheckResult",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("materialization_id", models.BigIntegerField()),
                ("dataset", models.CharField(max_length=200)),
                ("partition", models.CharField(blank=True, default="", max_length=200)),
                ("check_name", models.CharField(max_length=200)),
                ("severity", models.CharField(choices=[("warn", "warn"), ("error", "error")], max_length=5)),
                ("blocking", models.BooleanField()),
                ("passed", models.BooleanField(blank=True, help_text="empty while the check has not run", null=True)),
                ("figures", models.JSONField(blank=True, default=dict)),
                ("message", models.TextField(blank=True, default="")),
                ("at", models.DateTimeField(blank=True, help_text="when the result was stored", null=True)),
            ],
            options={
                "ordering": ["-id"],
                "permissions": [("override_dataset_check", "Can override a dataset's failed blocking checks")],
                "indexes": [
                    models.Index(
                        models.F("dataset"),
                        models.OrderBy(models.F("id"), descending=True),
                        name="check_result_dataset",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("materialization_id", "check_name"), name="check_result_once")
                ],
            },
        ),
    ]
