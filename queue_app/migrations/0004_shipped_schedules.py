"""The schedules jobsite ships: hourly queue analytics (Spark, disabled until an operator enables it) and
pruning of done items every ten minutes."""

from datetime import UTC, datetime

from croniter import croniter
from django.db import migrations

SHIPPED = [
    {
        "name": "queue-analytics-hourly",
        "cron": "5 * * * *",
        "target_kind": "spark",
        "target": "queue_analytics",
        "payload": {},
        "enabled": False,
        "catch_up": "skip",
    },
    {
        "name": "prune-done",
        "cron": "*/10 * * * *",
        "target_kind": "task",
        "target": "queue_app.prune",
        "payload": {},
        "enabled": True,
        "catch_up": "skip",
    },
]


def create(apps, schema_editor):
    Schedule = apps.get_model("queue_app", "Schedule")
    now = datetime.now(UTC)
    for spec in SHIPPED:
        # A disabled schedule has no next fire time; enabling it computes one from then.
        next_fire_at = croniter(spec["cron"], now).get_next(datetime) if spec["enabled"] else None
        Schedule.objects.using(schema_editor.connection.alias).get_or_create(
            name=spec["name"], defaults={**spec, "timezone": "UTC", "next_fire_at": next_fire_at}
        )


def remove(apps, schema_editor):
    Schedule = apps.get_model("queue_app", "Schedule")
    Schedule.objects.using(schema_editor.connection.alias).filter(name__in=[s["name"] for s in SHIPPED]).delete()


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0003_schedules_spark_runs_indexes")]

    operations = [migrations.RunPython(create, remove)]
