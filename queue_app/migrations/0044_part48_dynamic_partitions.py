from django.db import migrations, models
from django.db.models import Q
from django.db.models.functions import Now


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0043_sub48_subworkflows"),
    ]

    operations = [
        migrations.CreateModel(
            name="DynamicPartitionKey",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("partition_set", models.CharField(max_length=100)),
                ("key", models.CharField(max_length=100)),
                ("added_at", models.DateTimeField(db_default=Now())),
                (
                    "added_by",
                    models.CharField(
                        blank=True, default="", help_text="code, cli:USER, watch:NAME, admin:USER", max_length=150
                    ),
                ),
                ("removed_at", models.DateTimeField(blank=True, null=True)),
                ("removed_by", models.CharField(blank=True, default="", max_length=150)),
            ],
            options={
                "ordering": ["partition_set", "key", "-id"],
                "permissions": [("change_dynamic_partitions", "Can add and remove a dynamic partition set's keys")],
                "constraints": [
                    models.UniqueConstraint(
                        condition=Q(removed_at__isnull=True),
                        fields=("partition_set", "key"),
                        name="dynamic_key_current",
                    )
                ],
            },
        ),
    ]
