# The observe permission on datasets and the OpenLineage emitter's drop counter (issue 38: lineage).

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0030_dataset_triggers"),
    ]

    operations = [
        migrations.CreateModel(
            name="OpenLineageCounter",
            fields=[
                ("name", models.CharField(max_length=50, primary_key=True, serialize=False)),
                ("value", models.BigIntegerField(default=0)),
                ("last_error", models.TextField(blank=True, default="")),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.AlterModelOptions(
            name="dataset",
            options={
                "permissions": [
                    ("observe_dataset", "Can observe a dataset's partition (record files written elsewhere)")
                ]
            },
        ),
    ]
