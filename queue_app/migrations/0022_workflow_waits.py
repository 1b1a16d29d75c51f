"""Workflows that wait, the foundation (issue 39).

- Idempotent starts: a start's key is claimed in the table queue_app_workflowstartkey (primary key (name, key))
  in the transaction that writes the workflow; a deleted workflow frees its key (queue_app_workflow_deleted).
"""

import django.db.models.functions.datetime
from django.db import migrations, models

# queue_app/workflows/sql.py's texts that changed, as of this migration (frozen: never import them from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_workflow_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_app_stepdependency d USING queue_app_workflowstep s, gone g
    WHERE s.workflow_id = g.id AND d.downstream_id = s.id;
    DELETE FROM queue_app_workflowstep s USING gone g WHERE s.workflow_id = g.id;
    DELETE FROM queue_app_workflowstartkey k USING gone g WHERE k.workflow_id = g.id;
    RETURN NULL;
END
$$;
"""

# The same functions as migration 0021 installed them.
PREVIOUS = r"""
CREATE OR REPLACE FUNCTION queue_app_workflow_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_app_stepdependency d USING queue_app_workflowstep s, gone g
    WHERE s.workflow_id = g.id AND d.downstream_id = s.id;
    DELETE FROM queue_app_workflowstep s USING gone g WHERE s.workflow_id = g.id;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0021_workflow_sql_one_home"),
    ]

    operations = [
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
                "indexes": [models.Index(models.F("workflow_id"), name="workflowstartkey_workflow")],
            },
        ),
        migrations.RunSQL(INSTALL, PREVIOUS),
    ]
