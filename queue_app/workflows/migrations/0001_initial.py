"""The workflows app's models, moved from the core app (queue_app 0047) with their tables as they are: this
migration only tells Django's state they are this app's (SeparateDatabaseAndState, no SQL on the tables, whose
names `db_table` keeps), and relabels their content types from queue_app to jobsite_workflows, keeping their ids
(granted permissions and admin log entries stay attached; queue_app/relabel.py). Backwards: the content types go back to
queue_app, the tables are not touched."""

import django.db.models.deletion
import django.db.models.fields.json
import django.db.models.functions.datetime
from django.db import migrations, models

import queue_app.workflows.models
from queue_app.relabel import relabel_migration

MODELS = ("workflowversion", "workflow", "workflowevent", "workflowstartkey", "workflowstep", "stepdependency")
relabel, relabel_back = relabel_migration("queue_app", "jobsite_workflows", MODELS)

STATE = [
    migrations.CreateModel(
        name="WorkflowVersion",
        fields=[
            (
                "pk",
                models.CompositePrimaryKey(
                    "name", "version", blank=True, editable=False, primary_key=True, serialize=False
                ),
            ),
            ("name", models.CharField(max_length=200)),
            ("version", models.CharField(max_length=100)),
            ("fingerprint", models.CharField(max_length=64)),
            ("shape", models.JSONField(default=dict)),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
        ],
        options={
            "db_table": "queue_app_workflowversion",
            "ordering": ["name", "created_at"],
        },
    ),
    migrations.CreateModel(
        name="Workflow",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("name", models.CharField(max_length=200)),
            (
                "kind",
                models.CharField(
                    choices=[("workflow", "Workflow"), ("backfill", "Backfill"), ("batch", "Batch")],
                    default="workflow",
                    max_length=10,
                ),
            ),
            ("params", models.JSONField(blank=True, default=dict)),
            (
                "state",
                models.CharField(
                    choices=[
                        ("running", "Running"),
                        ("failing", "Failing"),
                        ("compensating", "Compensating"),
                        ("cancelling", "Cancelling"),
                        ("succeeded", "Succeeded"),
                        ("failed", "Failed"),
                        ("cancelled", "Cancelled"),
                    ],
                    default="running",
                    max_length=12,
                ),
            ),
            ("attempt", models.PositiveIntegerField(default=1)),
            ("started_by", models.CharField(blank=True, default="", max_length=150)),
            ("steps_total", models.PositiveIntegerField(default=0)),
            ("steps_open", models.PositiveIntegerField(default=0)),
            ("steps_failed", models.PositiveIntegerField(default=0)),
            ("callbacks", models.JSONField(blank=True, default=dict)),
            ("channel", models.CharField(default="jobsite_queue", max_length=63)),
            (
                "default_max_attempts",
                models.PositiveIntegerField(default=queue_app.workflows.models.default_max_attempts),
            ),
            ("trace_context", models.TextField(blank=True, null=True)),
            ("error", models.TextField(blank=True, default="")),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("finished_at", models.DateTimeField(blank=True, null=True)),
            ("version", models.CharField(blank=True, default="", max_length=100)),
            ("forked_from", models.BigIntegerField(blank=True, null=True)),
            ("fork_step", models.CharField(blank=True, default="", max_length=200)),
            ("deadline", models.JSONField(blank=True, null=True)),
            ("deadline_at", models.DateTimeField(blank=True, null=True)),
        ],
        options={
            "db_table": "queue_app_workflow",
            "ordering": ["-id"],
            "permissions": [
                ("start_workflow", "Can start workflows and backfills"),
                ("cancel_workflow", "Can cancel workflows"),
                ("repair_workflow", "Can repair workflows"),
            ],
            "indexes": [
                models.Index(models.F("name"), models.OrderBy(models.F("id"), descending=True), name="workflow_name"),
                models.Index(models.F("state"), name="workflow_state"),
            ],
        },
    ),
    migrations.CreateModel(
        name="WorkflowEvent",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("name", models.CharField(max_length=200)),
            ("key", models.CharField(max_length=200)),
            ("payload", models.JSONField(blank=True, null=True)),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            (
                "expires_at",
                models.DateTimeField(help_text="End of its lookback: not matched to a wait created after it."),
            ),
            ("step_id", models.BigIntegerField(blank=True, help_text="The event wait it ended.", null=True)),
            ("claimed_at", models.DateTimeField(blank=True, null=True)),
        ],
        options={
            "db_table": "queue_app_workflowevent",
            "ordering": ["-id"],
            "indexes": [
                models.Index(
                    models.F("name"),
                    models.F("key"),
                    models.F("id"),
                    condition=models.Q(("step_id__isnull", True)),
                    name="workflowevent_open",
                )
            ],
            "constraints": [
                models.UniqueConstraint(
                    condition=models.Q(("step_id__isnull", False)), fields=("step_id",), name="workflowevent_step"
                )
            ],
        },
    ),
    migrations.CreateModel(
        name="WorkflowStartKey",
        fields=[
            (
                "pk",
                models.CompositePrimaryKey(
                    "name", "key", blank=True, editable=False, primary_key=True, serialize=False
                ),
            ),
            ("name", models.CharField(max_length=200)),
            ("key", models.CharField(max_length=200)),
            ("workflow_id", models.BigIntegerField()),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("expires_at", models.DateTimeField(blank=True, null=True)),
        ],
        options={
            "db_table": "queue_app_workflowstartkey",
            "indexes": [models.Index(models.F("workflow_id"), name="workflowstartkey_workflow")],
        },
    ),
    migrations.CreateModel(
        name="WorkflowStep",
        fields=[
            ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ("attempt", models.PositiveIntegerField()),
            ("name", models.CharField(max_length=200)),
            ("group", models.CharField(help_text="Sibling name: the steps of one fan-out share it.", max_length=200)),
            (
                "kind",
                models.CharField(
                    choices=[
                        ("task", "Task"),
                        ("spark", "Spark"),
                        ("compensation", "Compensation"),
                        ("sleep", "Sleep"),
                        ("event", "Event"),
                        ("approval", "Approval"),
                        ("workflow", "Workflow"),
                    ],
                    max_length=12,
                ),
            ),
            ("target", models.CharField(help_text="Task name or Spark job name.", max_length=200)),
            ("args", models.JSONField(blank=True, null=True)),
            ("spec", models.JSONField(default=dict)),
            (
                "on_failure",
                models.CharField(
                    choices=[
                        ("fail", "Fail the workflow and cancel what has not started"),
                        ("continue", "Continue: its dependents run anyway"),
                    ],
                    default="fail",
                    max_length=10,
                ),
            ),
            ("compensate", models.JSONField(blank=True, help_text="Item spec of the compensation task.", null=True)),
            (
                "kept",
                models.BooleanField(default=False, help_text="Succeeded in an earlier attempt; kept by a repair."),
            ),
            (
                "state",
                models.CharField(
                    choices=[
                        ("waiting", "Waiting"),
                        ("queued", "Queued"),
                        ("succeeded", "Succeeded"),
                        ("failed", "Failed"),
                        ("cancelled", "Cancelled"),
                        ("skipped", "Skipped"),
                    ],
                    default="waiting",
                    max_length=10,
                ),
            ),
            ("pending", models.PositiveIntegerField(default=0, help_text="Dependencies not finished yet.")),
            ("item_id", models.BigIntegerField(blank=True, null=True)),
            ("spark_run_id", models.BigIntegerField(blank=True, null=True)),
            ("child_workflow_id", models.BigIntegerField(blank=True, null=True)),
            ("result", models.JSONField(blank=True, null=True)),
            ("error", models.TextField(blank=True, default="")),
            ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ("ready_at", models.DateTimeField(blank=True, null=True)),
            ("finished_at", models.DateTimeField(blank=True, null=True)),
            (
                "compensates",
                models.ForeignKey(
                    blank=True,
                    db_constraint=False,
                    db_index=False,
                    null=True,
                    on_delete=django.db.models.deletion.DO_NOTHING,
                    related_name="+",
                    to="jobsite_workflows.workflowstep",
                ),
            ),
            (
                "parent",
                models.ForeignKey(
                    blank=True,
                    db_constraint=False,
                    db_index=False,
                    null=True,
                    on_delete=django.db.models.deletion.DO_NOTHING,
                    related_name="+",
                    to="jobsite_workflows.workflowstep",
                ),
            ),
            (
                "workflow",
                models.ForeignKey(
                    db_constraint=False,
                    db_index=False,
                    on_delete=django.db.models.deletion.DO_NOTHING,
                    related_name="steps",
                    to="jobsite_workflows.workflow",
                ),
            ),
        ],
        options={
            "db_table": "queue_app_workflowstep",
            "ordering": ["id"],
        },
    ),
    migrations.CreateModel(
        name="StepDependency",
        fields=[
            (
                "pk",
                models.CompositePrimaryKey(
                    "upstream_id", "downstream_id", blank=True, editable=False, primary_key=True, serialize=False
                ),
            ),
            ("order_only", models.BooleanField(db_default=False, default=False)),
            (
                "downstream",
                models.ForeignKey(
                    db_constraint=False,
                    db_index=False,
                    on_delete=django.db.models.deletion.DO_NOTHING,
                    related_name="+",
                    to="jobsite_workflows.workflowstep",
                ),
            ),
            (
                "upstream",
                models.ForeignKey(
                    db_constraint=False,
                    db_index=False,
                    on_delete=django.db.models.deletion.DO_NOTHING,
                    related_name="+",
                    to="jobsite_workflows.workflowstep",
                ),
            ),
        ],
        options={
            "db_table": "queue_app_stepdependency",
        },
    ),
    migrations.AddIndex(
        model_name="workflowstep",
        index=models.Index(
            condition=models.Q(("item_id__isnull", False)), fields=["item_id"], name="workflowstep_item"
        ),
    ),
    migrations.AddIndex(
        model_name="workflowstep",
        index=models.Index(
            condition=models.Q(("child_workflow_id__isnull", False)),
            fields=["child_workflow_id"],
            name="workflowstep_child",
        ),
    ),
    migrations.AddIndex(
        model_name="workflowstep",
        index=models.Index(
            django.db.models.fields.json.KeyTextTransform("event", "spec"),
            django.db.models.fields.json.KeyTextTransform("key", "spec"),
            condition=models.Q(("kind", "event"), ("state", "queued")),
            name="workflowstep_event",
        ),
    ),
    migrations.AddConstraint(
        model_name="workflowstep",
        constraint=models.UniqueConstraint(
            models.F("workflow"), models.F("attempt"), models.F("name"), name="workflowstep_name"
        ),
    ),
    migrations.AddIndex(
        model_name="stepdependency",
        index=models.Index(models.F("downstream"), name="stepdependency_downstream"),
    ),
]


class Migration(migrations.Migration):
    initial = True

    dependencies = [("queue_app", "0047_layer_models_move")]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=STATE),
        migrations.RunPython(relabel, relabel_back, elidable=False),
    ]
