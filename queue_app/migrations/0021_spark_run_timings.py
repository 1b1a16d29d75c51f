"""Spark runs: the trigger's labels read "CLI" and "ORM" (were "Cli", "Orm"); no change to the stored values."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0020_id_marks"),
    ]

    operations = [
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
