"""The datasets app's models, moved from the core app (queue_app 0047) with their tables as they are: this
migration only tells Django's state they are this app's (SeparateDatabaseAndState, no SQL on the tables, whose
names `db_table` keeps), and relabels their content types from queue_app to jobsite_datasets, keeping their ids (granted
permissions and admin log entries stay attached; queue_app/relabel.py). Backwards: the content types go back to
queue_app, the tables are not touched."""

import django.db.models.functions.datetime
from django.db import migrations, models

from queue_app.relabel import relabel_migration

MODELS = (
    "dataset",
    "openlineagecounter",
    "datasetblock",
    "datasetcheckresult",
    "dynamicpartitionkey",
    "materialization",
    "staleepisode",
    "triggerfire",
    "triggerstate",
)
relabel, relabel_back = relabel_migration("queue_app", "jobsite_datasets", MODELS)

STATE = [
    migrations.CreateModel(
        name="Dataset",
        fields=[
            ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
            ("config", models.JSONField(default=dict, help_text="the declaration: location, partitioning, owner, ...")),
            (
                "declared_in",
                models.CharField(
                    choices=[("code", "Code"), ("settings", "Settings"), ("admin", "Admin")], max_length=10
                ),
            ),
            ("synced_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ],
        options={
            "db_table": "queue_app_dataset",
            "permissions": [("observe_dataset", "Can observe a dataset's partition (record files written elsewhere)")],
        },
    ),
    migrations.CreateModel(
        name="OpenLineageCounter",
        fields=[
            ("name", models.CharField(max_length=50, primary_key=True, serialize=False)),
            ("value", models.BigIntegerField(default=0)),
            ("last_error", models.TextField(blank=True, default="")),
            ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ],
        options={
            "db_table": "queue_app_openlineagecounter",
        },
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
            "db_table": "queue_app_datasetblock",
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
            "db_table": "queue_app_datasetcheckresult",
            "ordering": ["-id"],
            "permissions": [("override_dataset_check", "Can override a dataset's failed blocking checks")],
            "indexes": [
                models.Index(
                    models.F("dataset"), models.OrderBy(models.F("id"), descending=True), name="check_result_dataset"
                )
            ],
            "constraints": [
                models.UniqueConstraint(fields=("materialization_id", "check_name"), name="check_result_once")
            ],
        },
    ),
    migrations.CreateModel(
        name="DynamicPartitionKey",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("partition_set", models.CharField(max_length=100)),
            ("key", models.CharField(max_length=100)),
            ("added_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
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
            "db_table": "queue_app_dynamicpartitionkey",
            "ordering": ["partition_set", "key", "-id"],
            "permissions": [("change_dynamic_partitions", "Can add and remove a dynamic partition set's keys")],
            "constraints": [
                models.UniqueConstraint(
                    condition=models.Q(("removed_at__isnull", True)),
                    fields=("partition_set", "key"),
                    name="dynamic_key_current",
                )
            ],
        },
    ),
    migrations.CreateModel(
        name="Materialization",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("dataset", models.CharField(max_length=200)),
            ("partition", models.CharField(blank=True, default="", max_length=200)),
            ("at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("rows", models.BigIntegerField(blank=True, null=True)),
            ("bytes", models.BigIntegerField(blank=True, null=True)),
            ("files", models.BigIntegerField(blank=True, null=True)),
            ("schema_fingerprint", models.CharField(blank=True, default="", max_length=64)),
            ("metadata", models.JSONField(blank=True, default=dict)),
            (
                "source",
                models.CharField(
                    choices=[
                        ("spark_run", "Spark Run"),
                        ("workflow_step", "Workflow Step"),
                        ("item", "Item"),
                        ("observed", "Observed"),
                        ("code", "Code"),
                    ],
                    max_length=20,
                ),
            ),
            ("spark_run_id", models.BigIntegerField(blank=True, null=True)),
            ("workflow_step_id", models.BigIntegerField(blank=True, null=True)),
            ("item_id", models.BigIntegerField(blank=True, null=True)),
            (
                "checks",
                models.CharField(
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
        ],
        options={
            "db_table": "queue_app_materialization",
            "ordering": ["-at", "-id"],
            "indexes": [
                models.Index(
                    models.F("dataset"),
                    models.F("partition"),
                    models.OrderBy(models.F("at"), descending=True),
                    name="materialization_partition",
                ),
                models.Index(
                    models.F("dataset"),
                    models.OrderBy(models.F("at"), descending=True),
                    models.OrderBy(models.F("id"), descending=True),
                    name="materialization_latest",
                ),
            ],
            "constraints": [
                models.CheckConstraint(
                    condition=models.Q(("rows__gte", 0), ("bytes__gte", 0), ("files__gte", 0)),
                    name="materialization_figures",
                )
            ],
        },
    ),
    migrations.CreateModel(
        name="StaleEpisode",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("dataset", models.CharField(max_length=200)),
            ("overdue_since", models.DateTimeField()),
            ("detected_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            (
                "partition",
                models.CharField(blank=True, help_text="empty: no producer started", max_length=200, null=True),
            ),
            ("started", models.JSONField(blank=True, default=list, help_text='what it started: ["spark_run:12"]')),
            ("error", models.TextField(blank=True, default="")),
        ],
        options={
            "db_table": "queue_app_staleepisode",
            "constraints": [models.UniqueConstraint(fields=("dataset", "overdue_since"), name="stale_episode_once")],
        },
    ),
    migrations.CreateModel(
        name="TriggerFire",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("consumer", models.CharField(max_length=250)),
            ("partition", models.CharField(blank=True, default="", max_length=200)),
            ("fingerprint", models.CharField(help_text="SHA-256 of the upstream materialization ids", max_length=64)),
            ("upstream", models.JSONField(default=dict, help_text="{dataset: materialization id}")),
            ("started", models.JSONField(blank=True, default=list, help_text='what it started: ["spark_run:12"]')),
            ("error", models.TextField(blank=True, default="")),
            ("at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ],
        options={
            "db_table": "queue_app_triggerfire",
            "ordering": ["-at", "-id"],
            "constraints": [
                models.UniqueConstraint(fields=("consumer", "partition", "fingerprint"), name="trigger_fire_once")
            ],
        },
    ),
    migrations.CreateModel(
        name="TriggerState",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("consumer", models.CharField(help_text="kind:name, e.g. spark:daily_report", max_length=250)),
            ("partition", models.CharField(blank=True, default="", max_length=200)),
            (
                "pending",
                models.JSONField(
                    blank=True, default=dict, help_text="{dataset: materialization id} since its last run"
                ),
            ),
            (
                "seen",
                models.JSONField(blank=True, default=dict, help_text="{dataset: newest materialization id counted}"),
            ),
            ("due_at", models.DateTimeField(blank=True, help_text="debounced: when the pending run starts", null=True)),
            (
                "timer_item_id",
                models.BigIntegerField(blank=True, help_text="debounced: the delayed queue item", null=True),
            ),
            ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ],
        options={
            "db_table": "queue_app_triggerstate",
            "constraints": [models.UniqueConstraint(fields=("consumer", "partition"), name="trigger_state_once")],
        },
    ),
]


class Migration(migrations.Migration):
    initial = True

    dependencies = [("queue_app", "0047_layer_models_move")]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=STATE),
        migrations.RunPython(relabel, relabel_back, elidable=False),
    ]
