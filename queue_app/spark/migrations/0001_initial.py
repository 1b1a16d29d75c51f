"""The Spark app's models, moved from the core app (queue_app 0047) with their tables as they are: this
migration only tells Django's state they are this app's (SeparateDatabaseAndState, no SQL on the tables, whose
names `db_table` keeps), and relabels their content types from queue_app to jobsite_spark, keeping their ids (granted
permissions and admin log entries stay attached; queue_app/relabel.py). Backwards: the content types go back to
queue_app, the tables are not touched."""

import django.db.models.functions.datetime
from django.db import migrations, models

from queue_app.relabel import relabel_migration

MODELS = ("sparkconnectserver", "sparkscript", "sparkwatermark", "queuestatshourly", "sparkrun")
relabel, relabel_back = relabel_migration("queue_app", "jobsite_spark", MODELS)

STATE = [
    migrations.CreateModel(
        name="SparkConnectServer",
        fields=[
            ("id", models.CharField(help_text="host:port", max_length=300, primary_key=True, serialize=False)),
            ("url", models.CharField(max_length=200)),
            ("master", models.CharField(blank=True, default="", max_length=200)),
            ("host", models.CharField(max_length=255)),
            ("pid", models.IntegerField(blank=True, help_text="The server's JVM (spark-submit) process.", null=True)),
            ("healthy", models.BooleanField(default=False)),
            ("restarts", models.PositiveIntegerField(default=0)),
            ("last_error", models.TextField(blank=True, default="")),
            ("started_at", models.DateTimeField(blank=True, null=True)),
            ("last_heartbeat", models.DateTimeField(blank=True, null=True)),
        ],
        options={
            "verbose_name": "Spark Connect server",
            "db_table": "queue_app_sparkconnectserver",
        },
    ),
    migrations.CreateModel(
        name="SparkScript",
        fields=[
            ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
            ("name", models.SlugField(help_text="The job name runs are triggered by.", max_length=100, unique=True)),
            ("description", models.CharField(blank=True, default="", max_length=300)),
            ("enabled", models.BooleanField(default=True)),
            (
                "path",
                models.CharField(
                    help_text="A .py file, or a dotted module name, under an allowed root.", max_length=1000
                ),
            ),
            (
                "py_files",
                models.JSONField(blank=True, default=list, help_text='--py-files, a JSON list: ["/srv/jobs/lib.zip"].'),
            ),
            (
                "args",
                models.JSONField(
                    blank=True, default=list, help_text='Argument template: a JSON list; "{name}" = a param.'
                ),
            ),
            (
                "params",
                models.JSONField(
                    blank=True,
                    default=list,
                    help_text='Declared params: [{"name": "input", "type": "path", "required": true}].',
                ),
            ),
            (
                "conf",
                models.JSONField(
                    blank=True, default=dict, help_text='Spark conf: {"spark.sql.shuffle.partitions": "8"}.'
                ),
            ),
            ("env", models.JSONField(blank=True, default=dict, help_text="Environment variables for the run.")),
            ("driver_memory", models.CharField(blank=True, default="", help_text="e.g. 1g", max_length=12)),
            ("executor_memory", models.CharField(blank=True, default="", help_text="e.g. 2g", max_length=12)),
            ("driver_cores", models.PositiveSmallIntegerField(blank=True, null=True)),
            ("executor_cores", models.PositiveSmallIntegerField(blank=True, null=True)),
            (
                "policy",
                models.JSONField(
                    blank=True,
                    default=dict,
                    help_text='Run policy: {"max_concurrent": 1, "attempts": 3, "retry_on": ["failed"], "timeout": 600, "resource_profile": "small", "priority": 0, "keep_days": 30}.',
                ),
            ),
            (
                "produces",
                models.JSONField(
                    blank=True,
                    default=dict,
                    help_text='Datasets it writes: {"daily_revenue": "day"} (the param naming the partition) or ["rollup"].',
                ),
            ),
            (
                "consumes",
                models.JSONField(
                    blank=True, default=dict, help_text='Datasets it reads: ["events"] or {"events": "day"}.'
                ),
            ),
            ("updated_at", models.DateTimeField(auto_now=True)),
            ("updated_by", models.CharField(blank=True, default="", max_length=150)),
        ],
        options={
            "db_table": "queue_app_sparkscript",
            "ordering": ["name"],
        },
    ),
    migrations.CreateModel(
        name="SparkWatermark",
        fields=[
            ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
            ("value", models.BigIntegerField()),
            ("as_of", models.DateTimeField()),
            ("run_id", models.BigIntegerField(null=True)),
            ("updated_at", models.DateTimeField(auto_now=True)),
        ],
        options={
            "db_table": "queue_app_sparkwatermark",
        },
    ),
    migrations.CreateModel(
        name="QueueStatsHourly",
        fields=[
            (
                "pk",
                models.CompositePrimaryKey(
                    "queue", "task", "hour", blank=True, editable=False, primary_key=True, serialize=False
                ),
            ),
            ("queue", models.CharField(max_length=100)),
            ("task", models.CharField(max_length=200)),
            ("hour", models.DateTimeField()),
            ("processed", models.BigIntegerField(default=0)),
            ("failed", models.BigIntegerField(default=0)),
            ("dead", models.BigIntegerField(default=0)),
            ("retries", models.BigIntegerField(default=0)),
            ("wait_p50", models.FloatField(null=True)),
            ("wait_p95", models.FloatField(null=True)),
            ("wait_p99", models.FloatField(null=True)),
            ("run_p50", models.FloatField(null=True)),
            ("run_p95", models.FloatField(null=True)),
            ("run_p99", models.FloatField(null=True)),
            ("computed_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("run_id", models.BigIntegerField(null=True)),
            ("as_of", models.DateTimeField(null=True)),
        ],
        options={
            "db_table": "queue_app_queuestats_hourly",
            "ordering": ["-hour"],
            "indexes": [models.Index(models.F("hour"), name="queuestats_hourly_hour")],
        },
    ),
    migrations.CreateModel(
        name="SparkRun",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("job", models.CharField(max_length=100)),
            ("params", models.JSONField(blank=True, default=dict)),
            (
                "state",
                models.CharField(
                    choices=[
                        ("queued", "Queued"),
                        ("starting", "Starting"),
                        ("running", "Running"),
                        ("cancelling", "Cancelling"),
                        ("succeeded", "Succeeded"),
                        ("failed", "Failed"),
                        ("cancelled", "Cancelled"),
                        ("timed_out", "Timed Out"),
                    ],
                    default="queued",
                    max_length=12,
                ),
            ),
            (
                "trigger",
                models.CharField(
                    choices=[
                        ("dashboard", "Dashboard"),
                        ("schedule", "Schedule"),
                        ("orm", "ORM"),
                        ("cli", "CLI"),
                        ("workflow", "Workflow"),
                        ("dataset", "Dataset update"),
                    ],
                    default="orm",
                    max_length=12,
                ),
            ),
            ("requested_by", models.CharField(blank=True, default="", max_length=150)),
            (
                "item_id",
                models.BigIntegerField(blank=True, help_text="The queue item that carries the run.", null=True),
            ),
            ("attempt", models.PositiveIntegerField(default=0)),
            ("app_id", models.CharField(blank=True, default="", max_length=100)),
            ("ui_url", models.CharField(blank=True, default="", max_length=200)),
            ("driver_host", models.CharField(blank=True, default="", max_length=255)),
            ("driver_pgid", models.IntegerField(blank=True, null=True)),
            ("progress", models.JSONField(blank=True, default=dict)),
            ("log_tail", models.TextField(blank=True, default="")),
            ("metrics", models.JSONField(blank=True, null=True)),
            ("error", models.TextField(blank=True, default="")),
            (
                "timeout",
                models.FloatField(blank=True, help_text="Seconds before the run is stopped (timed_out).", null=True),
            ),
            ("queued_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("started_at", models.DateTimeField(blank=True, null=True)),
            ("finished_at", models.DateTimeField(blank=True, null=True)),
            ("cancel_requested_at", models.DateTimeField(blank=True, null=True)),
            ("timings", models.JSONField(blank=True, null=True)),
        ],
        options={
            "db_table": "queue_app_sparkrun",
            "ordering": ["-id"],
            "permissions": [
                ("trigger_sparkrun", "Can trigger Spark runs"),
                ("cancel_sparkrun", "Can cancel Spark runs"),
            ],
            "indexes": [
                models.Index(models.F("job"), models.OrderBy(models.F("id"), descending=True), name="sparkrun_job"),
                models.Index(models.F("state"), name="sparkrun_state"),
                models.Index(
                    condition=models.Q(("state__in", ("queued", "starting", "running", "cancelling"))),
                    fields=["item_id"],
                    name="sparkrun_open_item",
                ),
            ],
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
