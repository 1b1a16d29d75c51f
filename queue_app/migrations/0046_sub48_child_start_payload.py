"""Sub-workflows (issue 48): a sub-workflow step's start item carries the child's definition name, parameters and
declared key (the step's spec), so its handler builds the child's graph before its first statement and reads, locks
and makes what it needs in one (workflows/child_steps.py, start_child). An item queued before this migration
lacks them: its handler reads them from the step, as before.
"""

from django.db import migrations

# queue_app/workflows/sql.py's function, as of this migration (frozen: never import it from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_child_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
    SELECT nextval('queue_app_queueitem_id_seq'), NEW.spec->'start'->>'queue', NEW.spec->'start'->>'task',
           jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,
                              'step', NEW.name,
                              'workflow', NEW.spec->'workflow', 'params', NEW.spec->'params', 'key', NEW.spec->'key'),
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
"""
# 0043's function.
DROP = r"""
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
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0045_sub48_child_start_inline"),
    ]

    operations = [migrations.RunSQL(INSTALL, DROP)]
