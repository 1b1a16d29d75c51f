"""The shipped "dataset-watch" schedule: every minute, the file-arrival watches observe their new sets of files
(queue_app.dataset_watch: datasets/watches.py)."""

from datetime import UTC, datetime

from croniter import croniter
from django.db import migrations

SCHEDULE = {
    "name": "dataset-watch",
    "cron": "* * * * *",
    "target_kind": "task",
    "target": "queue_app.dataset_watch",
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
    dependencies = [("queue_app", "0038_sql_enqueue_debounce")]

    operations = [migrations.RunPython(create, remove)]
