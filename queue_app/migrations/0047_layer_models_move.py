"""The layer apps' models leave the core app's state: Spark runs (5 models), workflows (6), datasets (9) and
webhooks (3) become the models of jobsite_spark, jobsite_workflows, jobsite_datasets and jobsite_webhooks, whose
0001 migrations (which depend on this one) take them into their state as they are. State only
(SeparateDatabaseAndState with no database operations): the tables, their rows, indexes, constraints and triggers
stay where they are, under the names these migrations gave them (queue_app_*, kept by each model's `db_table`).
Dependents are removed first (attempts before deliveries before endpoints, dependencies before steps before
workflows). Backwards, the state comes back; no SQL either way."""

from django.db import migrations

STATE = [
    migrations.DeleteModel(name="WebhookAttempt"),
    migrations.DeleteModel(name="WebhookDelivery"),
    migrations.DeleteModel(name="WebhookEndpoint"),
    migrations.DeleteModel(name="StepDependency"),
    migrations.DeleteModel(name="WorkflowEvent"),
    migrations.DeleteModel(name="WorkflowStep"),
    migrations.DeleteModel(name="WorkflowStartKey"),
    migrations.DeleteModel(name="WorkflowVersion"),
    migrations.DeleteModel(name="Workflow"),
    migrations.DeleteModel(name="SparkConnectServer"),
    migrations.DeleteModel(name="SparkScript"),
    migrations.DeleteModel(name="SparkWatermark"),
    migrations.DeleteModel(name="QueueStatsHourly"),
    migrations.DeleteModel(name="SparkRun"),
    migrations.DeleteModel(name="Dataset"),
    migrations.DeleteModel(name="OpenLineageCounter"),
    migrations.DeleteModel(name="DatasetBlock"),
    migrations.DeleteModel(name="DatasetCheckResult"),
    migrations.DeleteModel(name="DynamicPartitionKey"),
    migrations.DeleteModel(name="Materialization"),
    migrations.DeleteModel(name="StaleEpisode"),
    migrations.DeleteModel(name="TriggerFire"),
    migrations.DeleteModel(name="TriggerState"),
]


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0046_sub48_child_start_payload")]

    operations = [migrations.SeparateDatabaseAndState(state_operations=STATE)]
