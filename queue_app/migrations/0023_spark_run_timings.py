"""Spark runs: when each step of a run's last attempt happened (`timings`, JSON, null until an attempt ends: the
run page and `spark_run --json` show the split), and the trigger's labels read "CLI" and "ORM" (were "Cli",
"Orm"; the stored values do not change). Nullable without a default: the workflow functions' INSERT of a run
names its columns and needs no change."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0022_datasets"),
    ]

    operations = [
        migrations.AddField(
            model_name="sparkrun",
            name="timings",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="sparkrun",
            name="trigger",
            field=models.CharField(
                choices=[
                    ("dashboard", "Dashboard"),
                    ("schedule", "Schedule"),
                    ("orm", "ORM"),
                    ("cli", "CLI"),
                    ("workflow", "Workflow"),
                ],
                default="orm",
                max_length=12,
            ),
        ),
    ]
