"""Workflows that wait, the foundation (issue 39).

- Idempotent starts: a start's key is claimed in the table queue_app_workflowstartkey (primary key (name, key))
  in the transaction that writes the workflow; a deleted workflow frees its key (queue_app_workflow_deleted).
- Durable sleep: an item a workflow makes from a spec with "delay" (seconds) or "until" (a time) is due then
  (queue_app_wf_enqueue, queue_app_wf_callback: the one item fragment); a sleep step's item is such a delayed
  no-op item. Steps get the kinds "sleep" and "event".
- Events: queue_app_workflowevent holds the events sent (workflows/waits.py, send_event); an event wait (a step
  of kind "event") is a queued step whose item is its delayed timeout. An event ends the oldest open wait for
  its name and key by settling that item done with its payload, in the statement that stores it; an event kept
  from before is claimed when the wait opens (queue_app_wf_enqueue). Both sides take an advisory lock on the
  name and key first. The index workflowstep_event finds the open waits by name and key.
"""

import django.db.models.fields.json
import django.db.models.functions.datetime
from django.db import migrations, models

# queue_app/workflows/sql.py's texts that changed, as of this migration (frozen: never import them from there).
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
CREATE OR REPLACE FUNCTION queue_app_wf_enqueue(ids bigint[], channel text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    item_seq regclass := pg_get_serial_sequence('queue_app_queueitem', 'id')::regclass;
    run_seq regclass := pg_get_serial_sequence('queue_app_sparkrun', 'id')::regclass;
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
               'ready', COALESCE((s.spec->>'priority')::smallint, 0), now(), now(), 0,
               COALESCE((s.spec->>'max_attempts')::int, q.max_attempts, s.default_max_attempts),
               (s.spec->>'lease_timeout')::float8, '', now(), now(), s.id
        FROM s
        LEFT JOIN queue_app_queue q ON q.name = s.spec->>'queue'
        RETURNING queue_id
    ), marked AS (
        UPDATE queue_app_workflowstep st
        SET state = 'queued', item_id = s.item_id, spark_run_id = s.run_id, ready_at = clock_timestamp()
        FROM s WHERE st.id = s.id
        RETURNING st.id
    )
    SELECT (SELECT count(*) FROM marked) INTO n
    FROM (SELECT count(pg_notify(channel, queue_id)::text) FROM (SELECT DISTINCT queue_id FROM items) AS q) AS woken;
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
           'ready', COALESCE((spec->>'priority')::smallint, 0), now(), now(), 0,
           COALESCE((spec->>'max_attempts')::int, q.max_attempts, w.default_max_attempts),
           (spec->>'lease_timeout')::float8, '', now(), now(), NULL
    FROM (SELECT default_max_attempts FROM queue_app_workflow WHERE id = wf_id) AS w
    LEFT JOIN queue_app_queue q ON q.name = spec->>'queue';
    PERFORM pg_notify(channel, spec->>'queue');
END
$$;

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
        ("queue_app", "0023_spark_run_timings"),
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
                ],
                max_length=12,
            ),
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
        migrations.AddIndex(
            model_name="workflowstep",
            index=models.Index(
                django.db.models.fields.json.KeyTextTransform("event", "spec"),
                django.db.models.fields.json.KeyTextTransform("key", "spec"),
                condition=models.Q(("kind", "event"), ("state", "queued")),
                name="workflowstep_event",
            ),
        ),
        migrations.RunSQL(INSTALL, PREVIOUS),
    ]
