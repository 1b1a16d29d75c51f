"""The datasets' staleness episodes (one `dataset.stale` event each: datasets/stale.py) and the shipped
"dataset-staleness" schedule that checks for them every minute."""

from datetime import UTC, datetime

import django.db.models.functions.datetime
from croniter import croniter
from django.db import migrations, models

SCHEDULE = {
    "name": "dataset-staleness",
    "cron": "* * * * *",
    "target_kind": "task",
    "target": "queue_app.dataset_staleness",
    "payload": {},
    "enabled": True,
    "catch_up": "skip",
}


def create(apps, schema_editor):
    Schedule = apps.get_model("queue_app", "Schedule")
    next_fire_at = croniter(SCHEDULE["cron"], datetime.now(UTC)).get_next(datetime)
    Schedule.objects.using(schema_editor.connection.alias).get_or_create(
        name=SCHEDULE["name"], defaults={**SCHEDULE, "timezone": "UTC", "next_fire_at": next_fire_at}
    )


def remove(apps, schema_editor):
    Schedule = apps.get_model("queue_app", "Schedule")
    Schedule.objects.using(schema_editor.connection.alias).filter(name=SCHEDULE["name"]).delete()


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0027_workflow_approvals")]

    operations = [
        migrations.CreateModel(
            name="StaleEpisode",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("dataset", models.CharField(max_length=200)),
                ("overdue_since", models.DateTimeField()),
                ("detected_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("dataset", "overdue_since"), name="stale_episode_once")
                ],
            },
        ),
        migrations.RunPython(create, remove),
    ]
