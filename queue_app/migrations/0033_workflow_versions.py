"""Workflow versions, forks and deadlines (issue 39): each run records its definition's version (Workflow.version;
the shape of each version once, WorkflowVersion), a fork names the workflow and step it came from, a workflow
keeps its deadline; a step with a deadline arms it when it becomes ready (the trigger workflow_step_deadline
queues one delayed queue_app.workflow_deadline item in that transaction).
"""

import django.db.models.functions.datetime
from django.db import migrations, models

# queue_app/workflows/sql.py's texts added, as of this migration (frozen: never import them from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_step_deadline() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id)
    SELECT nextval('queue_app_queueitem_id_seq'), NEW.spec->'deadline'->>'queue', NEW.spec->'deadline'->>'task',
           jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,
                              'step', NEW.name),
           'ready', COALESCE((NEW.spec->'deadline'->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((NEW.spec->'deadline'->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (NEW.spec->'deadline'->>'lease_timeout')::float8, '', now(), now(), NULL
    FROM (SELECT default_max_attempts FROM queue_app_workflow WHERE id = NEW.workflow_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = NEW.spec->'deadline'->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((NEW.spec->'deadline'->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((NEW.spec->'deadline'->>'delay')::float8, 0)))) AS at) AS due;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER workflow_step_deadline AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.state = 'queued' AND OLD.state = 'waiting' AND NEW.spec ? 'deadline')
    EXECUTE FUNCTION queue_app_wf_step_deadline();
"""
DROP = r"""
DROP TRIGGER IF EXISTS workflow_step_deadline ON queue_app_workflowstep;
DROP FUNCTION IF EXISTS queue_app_wf_step_deadline();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0032_workflow_conditions"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflow",
            name="version",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.AddField(
            model_name="workflow",
            name="forked_from",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflow",
            name="fork_step",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="workflow",
            name="deadline",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflow",
            name="deadline_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
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
                "ordering": ["name", "created_at"],
            },
        ),
        migrations.RunSQL(INSTALL, DROP),
    ]
