"""Traces (issue 40): the W3C trace context (a `traceparent`) stored with an item, its history and its workflow
(queue_app/engine/tracing.py), NULL with tracing off. The item view queue_app_item_all shows the new column (last,
as CREATE OR REPLACE VIEW requires), and the workflow functions that write step, callback and approval items copy
the workflow's context onto them (queue_app/workflows/sql.py's texts, frozen here).
"""

from django.db import migrations, models

ITEM_COLUMNS = (
    "id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts, lease_timeout,"
    " dedup_key, ordering_key, group_key, reservation_id, result, error, workflow_step_id, created_at, updated_at,"
    " finished_at"
)

VIEW = f"""
CREATE OR REPLACE VIEW queue_app_item_all AS
    SELECT {ITEM_COLUMNS}, trace_context FROM queue_app_queueitem
    UNION ALL
    SELECT {ITEM_COLUMNS}, trace_context FROM queue_app_itemhistory;
"""
# Back: the view without the column (a view cannot lose a column by CREATE OR REPLACE).
VIEW_BACK = f"""
DROP VIEW queue_app_item_all;
CREATE VIEW queue_app_item_all AS
    SELECT {ITEM_COLUMNS} FROM queue_app_queueitem
    UNION ALL
    SELECT {ITEM_COLUMNS} FROM queue_app_itemhistory;
"""

# queue_app/workflows/sql.py's texts changed, as of this migration (frozen: never import them from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_enqueue(ids bigint[], channel text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    item_seq regclass := pg_get_serial_sequence('queue_app_queueitem', 'id')::regclass;
    run_seq regclass := pg_get_serial_sequence('queue_app_sparkrun', 'id')::regclass;
    opened record;
    kept jsonb;
BEGIN
    WITH s AS MATERIALIZED (
        SELECT st.id, st.kind, st.spec, nextval(item_seq) AS item_id,
               CASE WHEN st.kind = 'spark' THEN nextval(run_seq) END AS run_id, w.default_max_attempts,
               w.trace_context
        FROM queue_app_workflowstep st JOIN queue_app_workflow w ON w.id = st.workflow_id
        WHERE st.id = ANY(ids) AND st.state = 'waiting'
        ORDER BY st.id
    ), runs AS (
        INSERT INTO queue_app_sparkrun (id, job, params, state, trigger, requested_by, item_id, attempt, app_id,
                                        ui_url, driver_host, progress, log_tail, error, timeout, queued_at)
        SELECT run_id, spec->>'job', spec->'params', 'queued', 'workflow', COALESCE(spec->>'requested_by', ''),
               item_id, 0, '', '', '', '{}'::jsonb, '', '', (spec->>'timeout')::float8, now()
        FROM s WHERE run_id IS NOT NULL
    ), items AS (
        INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
            max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
        SELECT s.item_id, s.spec->>'queue', s.spec->>'task',
               CASE WHEN s.run_id IS NULL THEN COALESCE(s.spec->'payload', 'null'::jsonb)
                    ELSE jsonb_build_object('run_id', s.run_id) END,
               'ready', COALESCE((s.spec->>'priority')::smallint, 0), due.at, due.at, 0,
               COALESCE((s.spec->>'max_attempts')::int, q.max_attempts, s.default_max_attempts),
               (s.spec->>'lease_timeout')::float8, '', now(), now(), s.id, s.trace_context
        FROM s
        LEFT JOIN queue_app_queue q ON q.name = s.spec->>'queue'
        CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((s.spec->>'until')::timestamptz,
                   now() + make_interval(secs => COALESCE((s.spec->>'delay')::float8, 0)))) AS at) AS due
        RETURNING queue_id
    ), marked AS (
        UPDATE queue_app_workflowstep st
        SET state = 'queued', item_id = s.item_id, spark_run_id = s.run_id, ready_at = clock_timestamp()
        FROM s WHERE st.id = s.id
        RETURNING st.id
    )
    SELECT (SELECT count(*) FROM marked) INTO n
    FROM (SELECT count(pg_notify(channel, queue_id)::text) FROM (SELECT DISTINCT queue_id FROM items) AS q) AS woken;
    -- An event wait now open whose event came first: the oldest kept event with its name and key claims it.
    FOR opened IN
        SELECT s.id, s.item_id, s.spec->>'event' AS event, s.spec->>'key' AS key,
               hashtextextended(concat_ws(chr(31), 'jobsite.wf_event', s.spec->>'event', s.spec->>'key'), 0) AS lock_key
        FROM queue_app_workflowstep s
        WHERE s.id = ANY(ids) AND s.kind = 'event' AND s.state = 'queued'
        ORDER BY lock_key, s.id
    LOOP
        PERFORM pg_advisory_xact_lock(opened.lock_key);
        UPDATE queue_app_workflowevent e SET step_id = opened.id, claimed_at = now()
        WHERE e.id = (SELECT o.id FROM queue_app_workflowevent o
                      WHERE o.name = opened.event AND o.key = opened.key AND o.step_id IS NULL AND o.expires_at > now()
                      ORDER BY o.id LIMIT 1 FOR UPDATE)
        RETURNING e.payload INTO kept;
        IF FOUND THEN
            UPDATE queue_app_queueitem SET state = 'done', result = kept, finished_at = now(), updated_at = now()
            WHERE id = opened.item_id AND state = 'ready';
        END IF;
    END LOOP;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION queue_app_wf_callback(wf_id bigint, spec jsonb, state text, channel text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF spec IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
    SELECT nextval('queue_app_queueitem_id_seq'), spec->>'queue', spec->>'task',
           CASE WHEN jsonb_typeof(spec->'payload') = 'object' THEN spec->'payload' ELSE '{}'::jsonb END
           || jsonb_build_object('workflow_id', wf_id, 'state', state),
           'ready', COALESCE((spec->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((spec->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (spec->>'lease_timeout')::float8, '', now(), now(), NULL, w.trace_context
    FROM (SELECT default_max_attempts, trace_context FROM queue_app_workflow WHERE id = wf_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = spec->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((spec->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((spec->>'delay')::float8, 0)))) AS at) AS due;
    PERFORM pg_notify(channel, spec->>'queue');
END
$$;

CREATE OR REPLACE FUNCTION queue_app_wf_approval_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.spec->'requested' IS NULL OR NOT EXISTS (
        SELECT 1 FROM queue_app_webhookendpoint WHERE enabled AND event_types ? 'workflow.approval_requested'
    ) THEN
        RETURN NULL;
    END IF;
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
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
           (NEW.spec->'requested'->>'lease_timeout')::float8, '', now(), now(), NULL, w.trace_context
    FROM (SELECT default_max_attempts, trace_context FROM queue_app_workflow WHERE id = NEW.workflow_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = NEW.spec->'requested'->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((NEW.spec->'requested'->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((NEW.spec->'requested'->>'delay')::float8, 0)))) AS at) AS due;
    PERFORM pg_notify(channel, NEW.spec->'requested'->>'queue') FROM queue_app_workflow WHERE id = NEW.workflow_id;
    RETURN NULL;
END
$$;
"""

# The same functions as migrations 0021, 0024 and 0027 left them.
UNINSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_enqueue(ids bigint[], channel text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    item_seq regclass := pg_get_serial_sequence('queue_app_queueitem', 'id')::regclass;
    run_seq regclass := pg_get_serial_sequence('queue_app_sparkrun', 'id')::regclass;
    opened record;
    kept jsonb;
BEGIN
    WITH s AS MATERIALIZED (
        SELECT st.id, st.kind, st.spec, nextval(item_seq) AS item_id,
               CASE WHEN st.kind = 'spark' THEN nextval(run_seq) END AS run_id, w.default_max_attempts
        FROM queue_app_workflowstep st JOIN queue_app_workflow w ON w.id = st.workflow_id
        WHERE st.id = ANY(ids) AND st.state = 'waiting'
        ORDER BY st.id
    ), runs AS (
        INSERT INTO queue_app_sparkrun (id, job, params, state, trigger, requested_by, item_id, attempt, app_id,
                                        ui_url, driver_host, progress, log_tail, error, timeout, queued_at)
        SELECT run_id, spec->>'job', spec->'params', 'queued', 'workflow', COALESCE(spec->>'requested_by', ''),
               item_id, 0, '', '', '', '{}'::jsonb, '', '', (spec->>'timeout')::float8, now()
        FROM s WHERE run_id IS NOT NULL
    ), items AS (
        INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
            max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id)
        SELECT s.item_id, s.spec->>'queue', s.spec->>'task',
               CASE WHEN s.run_id IS NULL THEN COALESCE(s.spec->'payload', 'null'::jsonb)
                    ELSE jsonb_build_object('run_id', s.run_id) END,
               'ready', COALESCE((s.spec->>'priority')::smallint, 0), due.at, due.at, 0,
               COALESCE((s.spec->>'max_attempts')::int, q.max_attempts, s.default_max_attempts),
               (s.spec->>'lease_timeout')::float8, '', now(), now(), s.id
        FROM s
        LEFT JOIN queue_app_queue q ON q.name = s.spec->>'queue'
        CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((s.spec->>'until')::timestamptz,
                   now() + make_interval(secs => COALESCE((s.spec->>'delay')::float8, 0)))) AS at) AS due
        RETURNING queue_id
    ), marked AS (
        UPDATE queue_app_workflowstep st
        SET state = 'queued', item_id = s.item_id, spark_run_id = s.run_id, ready_at = clock_timestamp()
        FROM s WHERE st.id = s.id
        RETURNING st.id
    )
    SELECT (SELECT count(*) FROM marked) INTO n
    FROM (SELECT count(pg_notify(channel, queue_id)::text) FROM (SELECT DISTINCT queue_id FROM items) AS q) AS woken;
    -- An event wait now open whose event came first: the oldest kept event with its name and key claims it.
    FOR opened IN
        SELECT s.id, s.item_id, s.spec->>'event' AS event, s.spec->>'key' AS key,
               hashtextextended(concat_ws(chr(31), 'jobsite.wf_event', s.spec->>'event', s.spec->>'key'), 0) AS lock_key
        FROM queue_app_workflowstep s
        WHERE s.id = ANY(ids) AND s.kind = 'event' AND s.state = 'queued'
        ORDER BY lock_key, s.id
    LOOP
        PERFORM pg_advisory_xact_lock(opened.lock_key);
        UPDATE queue_app_workflowevent e SET step_id = opened.id, claimed_at = now()
        WHERE e.id = (SELECT o.id FROM queue_app_workflowevent o
                      WHERE o.name = opened.event AND o.key = opened.key AND o.step_id IS NULL AND o.expires_at > now()
                      ORDER BY o.id LIMIT 1 FOR UPDATE)
        RETURNING e.payload INTO kept;
        IF FOUND THEN
            UPDATE queue_app_queueitem SET state = 'done', result = kept, finished_at = now(), updated_at = now()
            WHERE id = opened.item_id AND state = 'ready';
        END IF;
    END LOOP;
    RETURN n;
END
$$;

CREATE OR REPLACE FUNCTION queue_app_wf_callback(wf_id bigint, spec jsonb, state text, channel text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF spec IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id)
    SELECT nextval('queue_app_queueitem_id_seq'), spec->>'queue', spec->>'task',
           CASE WHEN jsonb_typeof(spec->'payload') = 'object' THEN spec->'payload' ELSE '{}'::jsonb END
           || jsonb_build_object('workflow_id', wf_id, 'state', state),
           'ready', COALESCE((spec->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((spec->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (spec->>'lease_timeout')::float8, '', now(), now(), NULL
    FROM (SELECT default_max_attempts FROM queue_app_workflow WHERE id = wf_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = spec->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((spec->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((spec->>'delay')::float8, 0)))) AS at) AS due;
    PERFORM pg_notify(channel, spec->>'queue');
END
$$;

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
"""

# The step deadline's item (0033) carries the workflow's trace context too: the same function, as
# workflows/sql.py has it now (STEP_DEADLINE_FUNCTION), and back to 0033's text.
STEP_DEADLINE = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_step_deadline() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
        max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
    SELECT nextval('queue_app_queueitem_id_seq'), NEW.spec->'deadline'->>'queue', NEW.spec->'deadline'->>'task',
           jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,
                              'step', NEW.name),
           'ready', COALESCE((NEW.spec->'deadline'->>'priority')::smallint, 0), due.at, due.at, 0,
           COALESCE((NEW.spec->'deadline'->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (NEW.spec->'deadline'->>'lease_timeout')::float8, '', now(), now(), NULL, w.trace_context
    FROM (SELECT default_max_attempts, trace_context FROM queue_app_workflow WHERE id = NEW.workflow_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = NEW.spec->'deadline'->>'queue'
    CROSS JOIN LATERAL (SELECT GREATEST(now(), COALESCE((NEW.spec->'deadline'->>'until')::timestamptz,
               now() + make_interval(secs => COALESCE((NEW.spec->'deadline'->>'delay')::float8, 0)))) AS at) AS due;
    RETURN NULL;
END
$$;
"""
STEP_DEADLINE_BACK = r"""
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
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0033_workflow_versions"),
    ]

    operations = [
        migrations.AddField(
            model_name="queueitem",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="itemhistory",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflow",
            name="trace_context",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.RunSQL(VIEW, VIEW_BACK),
        migrations.RunSQL(INSTALL, UNINSTALL),
        migrations.RunSQL(STEP_DEADLINE, STEP_DEADLINE_BACK),
    ]
