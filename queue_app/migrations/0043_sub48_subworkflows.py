"""Sub-workflows (issue 48): a step of kind "workflow" starts a child workflow and waits for it. The step's
child (WorkflowStep.child_workflow_id, indexed: the child's end looks its waiting steps up by it); the triggers
workflow_child_start (a ready sub-workflow step queues its start item), workflow_child_cancel (a cancelled one
queues its child's cancel) and workflow_child_ended (a child's end settles its parent step's wait, through
queue_app_wf_child_settle), all in the transaction that records the fact.
"""

from django.db import migrations, models

# queue_app/workflows/sql.py's texts added, as of this migration (frozen: never import them from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_child_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
    SELECT nextval('queue_app_queueitem_id_seq'), NEW.spec->'start'->>'queue', NEW.spec->'start'->>'task',
           jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,
                              'step', NEW.name),
           'ready', COALESCE((NEW.spec->'start'->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((NEW.spec->'start'->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (NEW.spec->'start'->>'lease_timeout')::float8, '', now(), now(), NULL, w.trace_context
    FROM (SELECT default_max_attempts, trace_context FROM queue_app_workflow WHERE id = NEW.workflow_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = NEW.spec->'start'->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((NEW.spec->'start'->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((NEW.spec->'start'->>'delay')::float8, 0)))) AS at) AS due;
    PERFORM pg_notify(channel, NEW.spec->'start'->>'queue') FROM queue_app_workflow WHERE id = NEW.workflow_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION queue_app_wf_child_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
    SELECT nextval('queue_app_queueitem_id_seq'), NEW.spec->'cancel'->>'queue', NEW.spec->'cancel'->>'task',
           jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,
                              'step', NEW.name),
           'ready', COALESCE((NEW.spec->'cancel'->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((NEW.spec->'cancel'->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (NEW.spec->'cancel'->>'lease_timeout')::float8, '', now(), now(), NULL, w.trace_context
    FROM (SELECT default_max_attempts, trace_context FROM queue_app_workflow WHERE id = NEW.workflow_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = NEW.spec->'cancel'->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((NEW.spec->'cancel'->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((NEW.spec->'cancel'->>'delay')::float8, 0)))) AS at) AS due;
    PERFORM pg_notify(channel, NEW.spec->'cancel'->>'queue') FROM queue_app_workflow WHERE id = NEW.workflow_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION queue_app_wf_child_settle(child_id bigint) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    c queue_app_workflow%ROWTYPE;
    n integer;
BEGIN
    SELECT * INTO c FROM queue_app_workflow WHERE id = child_id;
    IF c.state NOT IN ('succeeded', 'failed', 'cancelled') THEN
        RETURN 0;
    END IF;
    UPDATE queue_app_queueitem i
    SET state = CASE WHEN c.state = 'succeeded' THEN 'done' ELSE 'dead' END,
        result = jsonb_build_object('workflow_id', c.id, 'state', c.state, 'results', COALESCE((
            SELECT jsonb_object_agg(s.name, s.result) FROM queue_app_workflowstep s
            WHERE s.workflow_id = c.id AND s.attempt = c.attempt AND s.state = 'succeeded' AND s.kind <> 'compensation'
              AND NOT EXISTS (SELECT FROM queue_app_stepdependency d WHERE d.upstream_id = s.id AND NOT d.order_only)
        ), '{}'::jsonb)),
        error = CASE WHEN c.state = 'succeeded' THEN ''
                     ELSE 'child workflow ' || c.id || ' ' || c.state || COALESCE(': ' || NULLIF(c.error, ''), '') END,
        finished_at = now(), updated_at = now()
    FROM queue_app_workflowstep p
    WHERE p.child_workflow_id = c.id AND p.kind = 'workflow' AND p.state = 'queued' AND i.id = p.item_id
      AND i.state = 'ready';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION queue_app_wf_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queue_app_wf_child_settle(NEW.id);
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER workflow_child_start AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'workflow' AND NEW.state = 'queued' AND OLD.state = 'waiting')
    EXECUTE FUNCTION queue_app_wf_child_start();
CREATE OR REPLACE TRIGGER workflow_child_cancel AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'workflow' AND NEW.state = 'cancelled' AND OLD.state = 'queued')
    EXECUTE FUNCTION queue_app_wf_child_cancel();
CREATE OR REPLACE TRIGGER workflow_child_ended AFTER UPDATE OF state ON queue_app_workflow FOR EACH ROW
    WHEN (NEW.state IN ('succeeded', 'failed', 'cancelled') AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION queue_app_wf_child_ended();
"""
DROP = r"""
DROP TRIGGER IF EXISTS workflow_child_ended ON queue_app_workflow;
DROP TRIGGER IF EXISTS workflow_child_cancel ON queue_app_workflowstep;
DROP TRIGGER IF EXISTS workflow_child_start ON queue_app_workflowstep;
DROP FUNCTION IF EXISTS queue_app_wf_child_ended();
DROP FUNCTION IF EXISTS queue_app_wf_child_settle(bigint);
DROP FUNCTION IF EXISTS queue_app_wf_child_cancel();
DROP FUNCTION IF EXISTS queue_app_wf_child_start();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0042_leader_rows"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowstep",
            name="child_workflow_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
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
                    ("workflow", "Workflow"),
                ],
                max_length=12,
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
        migrations.RunSQL(INSTALL, DROP),
    ]
