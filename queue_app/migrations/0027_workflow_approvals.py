"""Approvals (issue 39): a human step, kind "approval" (workflows/approvals.py), whose item is its delayed timeout;
a decision settles that item while it is ready. When an approval step starts waiting, the trigger
workflow_approval_requested queues the `workflow.approval_requested` webhook event in that transaction (only
when an enabled endpoint subscribes).
"""

from django.db import migrations, models

# queue_app/workflows/sql.py's texts added, as of this migration (frozen: never import them from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_approval_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.spec->'requested' IS NULL OR NOT EXISTS (
        SELECT 1 FROM queue_app_webhookendpoint WHERE enabled AND event_types ? 'workflow.approval_requested'
    ) THEN
        RETURN NULL;
    END IF;
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id)
    SELECT nextval('queue_app_queueitem_id_seq'), NEW.spec->'requested'->>'queue', NEW.spec->'requested'->>'task',
           jsonb_build_object('type', 'workflow.approval_requested', 'data', jsonb_build_object(
               'workflow_id', NEW.workflow_id,
               'workflow', (SELECT name FROM queue_app_workflow WHERE id = NEW.workflow_id),
               'attempt', NEW.attempt, 'step', NEW.name, 'step_id', NEW.id, 'permission', NEW.spec->>'permission',
               'timeout', NEW.args->'timeout', 'on_timeout', NEW.args->>'on_timeout',
               'expires_at', CASE WHEN NEW.args->>'timeout' IS NOT NULL
                                  THEN (SELECT run_at FROM queue_app_queueitem WHERE id = NEW.item_id) END)),
           'ready', COALESCE((NEW.spec->'requested'->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((NEW.spec->'requested'->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (NEW.spec->'requested'->>'lease_timeout')::float8, '', now(), now(), NULL
    FROM (SELECT default_max_attempts FROM queue_app_workflow WHERE id = NEW.workflow_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = NEW.spec->'requested'->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((NEW.spec->'requested'->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((NEW.spec->'requested'->>'delay')::float8, 0)))) AS at) AS due;
    PERFORM pg_notify(channel, NEW.spec->'requested'->>'queue') FROM queue_app_workflow WHERE id = NEW.workflow_id;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER workflow_approval_requested AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'approval' AND NEW.state = 'queued' AND OLD.state = 'waiting')
    EXECUTE FUNCTION queue_app_wf_approval_requested();
"""
DROP = r"""
DROP TRIGGER IF EXISTS workflow_approval_requested ON queue_app_workflowstep;
DROP FUNCTION IF EXISTS queue_app_wf_approval_requested();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0026_spark_script_datasets"),
    ]

    operations = [
        migrations.AlterField(
            model_name="workflowstep",
            name="kind",
            field=models.CharField(
                choices=[
                    ("task", "Task"),
                    ("spark", "Spark"),
                    ("compensation", "Compensation"),
                    ("sleep", "Sleep"),
                    ("event", "Event"),
                    ("approval", "Approval"),
                ],
                max_length=12,
            ),
        ),
        migrations.RunSQL(INSTALL, DROP),
    ]
