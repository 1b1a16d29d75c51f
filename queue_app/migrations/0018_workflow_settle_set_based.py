"""Workflow steps settle set-based (issue 20's per-step cost goal).

Before: the row trigger on queue items updated each step item's step row on its own (one plpgsql UPDATE per
item) and remembered the step for the statement trigger. Now the row trigger only remembers the item, and the
statement trigger ends all the steps of the statement's items in one UPDATE (the step row's `state = 'queued'`
is still the claim: at most once), then moves their workflows forward as before. Step rows keep a quarter of
each page free so that this update (no indexed column changes) stays HOT.

Fewer writes per step and edge: the step's parent and compensates links and an edge's upstream end lose their
foreign key constraints (checked once per row at commit) and indexes (never looked up); the edge's downstream
constraint stays for its cascade, its duplicate index (beside stepdependency_downstream) goes, and so does the
index on a step's workflow (the unique index workflowstep_name starts with it).
"""

import django.db.models.deletion
from django.db import migrations, models

SETTLE_FUNCTIONS = r"""
-- Each step item that ended (the WHEN of the row trigger workflow_step_settled): remembered for the end of the
-- statement, where queue_app_wf_statement_settled ends the steps of all of them in one go.
CREATE OR REPLACE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobsite.workflow_items_ended',
                       COALESCE(current_setting('jobsite.workflow_items_ended', true), '') || NEW.id::text || ',',
                       true);
    RETURN NULL;
END
$$;

-- Once per UPDATE statement on queue items: the steps of the step items it ended end the same way, in one
-- UPDATE, each at most once (the step row's state is the claim); a Spark step's outcome and result are its
-- run's (state and metrics). Then their workflows move forward (queue_app_wf_steps_settled). For a statement
-- that ended no step item (every plain settle) this is one lookup of a transaction-local setting.
CREATE OR REPLACE FUNCTION queue_app_wf_statement_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended text := current_setting('jobsite.workflow_items_ended', true);
    steps bigint[];
BEGIN
    IF ended IS NULL OR ended = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('jobsite.workflow_items_ended', '', true);
    WITH settled AS (
        UPDATE queue_app_workflowstep s
        SET state = CASE
                WHEN i.state = 'dead' THEN 'failed'
                WHEN i.state <> 'done' THEN 'cancelled'
                WHEN s.spark_run_id IS NULL THEN 'succeeded'
                ELSE (SELECT CASE r.state WHEN 'succeeded' THEN 'succeeded' WHEN 'cancelled' THEN 'cancelled'
                                          ELSE 'failed' END
                      FROM queue_app_sparkrun r WHERE r.id = s.spark_run_id)
            END,
            result = CASE WHEN s.spark_run_id IS NULL THEN i.result
                          ELSE (SELECT r.metrics FROM queue_app_sparkrun r WHERE r.id = s.spark_run_id) END,
            error = COALESCE(i.error, ''), finished_at = now()
        FROM queue_app_queueitem i
        WHERE i.id = ANY(string_to_array(rtrim(ended, ','), ',')::bigint[])
          AND s.id = i.workflow_step_id AND s.item_id = i.id AND s.state = 'queued'
        RETURNING s.id
    )
    SELECT array_agg(id) INTO steps FROM settled;
    IF steps IS NOT NULL THEN
        PERFORM queue_app_wf_steps_settled(steps);
    END IF;
    RETURN NULL;
END
$$;

-- The steps named ended (their rows already say how): as in migration 0014, in one go per statement under each
-- workflow's row lock (taken in id order), but the ended steps are read once, driven by their ids (a primary-key
-- probe each): 0014 read them three times and, planned on statistics older than a fan-out, read them through
-- every step of every workflow (30 to 60 ms per batch of 500 in queue_bench's workflow part).
CREATE OR REPLACE FUNCTION queue_app_wf_steps_settled(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e_id bigint[];
    e_workflow bigint[];
    e_state text[];
    e_kind text[];
    e_proceeds boolean[];
    ready bigint[];
    failed_id bigint;
    wf record;
BEGIN
    PERFORM 1 FROM queue_app_workflow
    WHERE id IN (SELECT s.workflow_id FROM unnest(ids) AS x(id) JOIN queue_app_workflowstep s ON s.id = x.id)
    ORDER BY id FOR UPDATE;
    -- The steps of each workflow's current attempt (a late settle of an earlier attempt's step changes nothing
    -- more).
    SELECT array_agg(s.id ORDER BY s.id), array_agg(s.workflow_id ORDER BY s.id), array_agg(s.state ORDER BY s.id),
           array_agg(s.kind ORDER BY s.id),
           array_agg(s.state = 'succeeded' OR (s.state = 'failed' AND s.on_failure = 'continue') ORDER BY s.id)
    INTO e_id, e_workflow, e_state, e_kind, e_proceeds
    FROM unnest(ids) AS x(id) JOIN queue_app_workflowstep s ON s.id = x.id
    WHERE s.attempt = (SELECT w.attempt FROM queue_app_workflow w WHERE w.id = s.workflow_id);
    IF e_id IS NULL THEN
        RETURN;
    END IF;
    WITH counts AS (
        SELECT d.downstream_id, count(*) AS n
        FROM unnest(e_id, e_proceeds) AS x(id, proceeds) JOIN queue_app_stepdependency d ON d.upstream_id = x.id
        WHERE x.proceeds
        GROUP BY d.downstream_id
    ), d AS (
        UPDATE queue_app_workflowstep t SET pending = t.pending - c.n
        FROM counts c WHERE t.id = c.downstream_id AND t.state = 'waiting'
        RETURNING t.id, t.pending
    )
    SELECT array_agg(id) INTO ready FROM d WHERE pending = 0;
    FOR wf IN
        WITH c AS (
            SELECT workflow_id, count(*) AS n, count(*) FILTER (WHERE state <> 'succeeded') AS bad,
                   count(*) FILTER (WHERE state <> 'succeeded' AND kind <> 'compensation') AS bad_steps
            FROM unnest(e_workflow, e_state, e_kind) AS x(workflow_id, state, kind) GROUP BY workflow_id
        ), old AS (
            SELECT w.id, w.steps_failed, w.state, w.callbacks, w.channel, c.n, c.bad, c.bad_steps
            FROM c JOIN queue_app_workflow w ON w.id = c.workflow_id
        )
        UPDATE queue_app_workflow w
        SET steps_open = w.steps_open - old.n,
            steps_failed = w.steps_failed + CASE WHEN old.state = 'cancelling' THEN 0 ELSE old.bad END
        FROM old WHERE w.id = old.id
        RETURNING w.id, old.steps_failed AS failed_before, old.state AS state_before, old.callbacks, old.channel,
                  old.bad_steps
    LOOP
        IF wf.failed_before = 0 AND wf.bad_steps > 0 AND wf.state_before NOT IN ('cancelling', 'compensating') THEN
            PERFORM queue_app_wf_callback(wf.id, wf.callbacks->'dead', 'failing', wf.channel);
        END IF;
    END LOOP;
    FOR failed_id IN SELECT x.id FROM unnest(e_id, e_proceeds) AS x(id, proceeds) WHERE NOT x.proceeds ORDER BY x.id
    LOOP
        PERFORM queue_app_wf_step_failed(failed_id);
    END LOOP;
    IF ready IS NOT NULL THEN
        PERFORM queue_app_wf_enqueue(ready, w.channel)
        FROM (SELECT DISTINCT s.workflow_id FROM unnest(ready) AS x(id) JOIN queue_app_workflowstep s ON s.id = x.id) r
        JOIN queue_app_workflow w ON w.id = r.workflow_id;
    END IF;
    PERFORM queue_app_wf_finish(w.id)
    FROM (SELECT DISTINCT x.workflow_id FROM unnest(e_workflow) AS x(workflow_id)) AS x
    JOIN queue_app_workflow w ON w.id = x.workflow_id
    WHERE w.steps_open = 0;
END
$$;

ALTER TABLE queue_app_workflowstep SET (fillfactor = 75);
"""


# Migration 0014's queue_app_wf_enqueue as this migration found it: its reverse puts it back. A frozen copy,
# like every function text in a migration (the current ones live in queue_app/workflows/sql.py).
ENQUEUE_FUNCTION = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_enqueue(ids bigint[], channel text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    item_seq regclass := pg_get_serial_sequence('queue_app_queueitem', 'id')::regclass;
    run_seq regclass := pg_get_serial_sequence('queue_app_sparkrun', 'id')::regclass;
BEGIN
    WITH s AS MATERIALIZED (
        SELECT st.id, st.kind, st.spec, nextval(item_seq) AS item_id,
               CASE WHEN st.kind = 'spark' THEN nextval(run_seq) END AS run_id
        FROM queue_app_workflowstep st
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
                                         max_attempts, lease_timeout, error, created_at, updated_at,
                                         workflow_step_id)
        SELECT s.item_id, s.spec->>'queue', s.spec->>'task',
               CASE WHEN s.run_id IS NULL THEN COALESCE(s.spec->'payload', 'null'::jsonb)
                    ELSE jsonb_build_object('run_id', s.run_id) END,
               'ready', COALESCE((s.spec->>'priority')::smallint, 0), now(), now(), 0,
               COALESCE((s.spec->>'max_attempts')::int, q.max_attempts, 5), (s.spec->>'lease_timeout')::float8,
               '', now(), now(), s.id
        FROM s LEFT JOIN queue_app_queue q ON q.name = s.spec->>'queue'
        RETURNING queue_id
    ), marked AS (
        UPDATE queue_app_workflowstep st
        SET state = 'queued', item_id = s.item_id, spark_run_id = s.run_id, ready_at = now()
        FROM s WHERE st.id = s.id
        RETURNING st.id
    )
    SELECT (SELECT count(*) FROM marked) INTO n
    FROM (SELECT count(pg_notify(channel, queue_id)::text) FROM (SELECT DISTINCT queue_id FROM items) AS q) AS woken;
    RETURN n;
END
$$;

"""

# A step's ready_at is the clock when its item is enqueued, no longer its transaction's start: that transaction
# may have started before the one that settled another of its dependencies, then waited for the workflow's row
# lock (held by that one until it committed). The clock, read under the lock, is later than every dependency's
# finished_at, so "ready after its dependencies finished" reads true on the rows, not only in commit order.
ENQUEUE_ON_THE_CLOCK = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_enqueue(ids bigint[], channel text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    item_seq regclass := pg_get_serial_sequence('queue_app_queueitem', 'id')::regclass;
    run_seq regclass := pg_get_serial_sequence('queue_app_sparkrun', 'id')::regclass;
BEGIN
    WITH s AS MATERIALIZED (
        SELECT st.id, st.kind, st.spec, nextval(item_seq) AS item_id,
               CASE WHEN st.kind = 'spark' THEN nextval(run_seq) END AS run_id
        FROM queue_app_workflowstep st
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
                                         max_attempts, lease_timeout, error, created_at, updated_at,
                                         workflow_step_id)
        SELECT s.item_id, s.spec->>'queue', s.spec->>'task',
               CASE WHEN s.run_id IS NULL THEN COALESCE(s.spec->'payload', 'null'::jsonb)
                    ELSE jsonb_build_object('run_id', s.run_id) END,
               'ready', COALESCE((s.spec->>'priority')::smallint, 0), now(), now(), 0,
               COALESCE((s.spec->>'max_attempts')::int, q.max_attempts, 5), (s.spec->>'lease_timeout')::float8,
               '', now(), now(), s.id
        FROM s LEFT JOIN queue_app_queue q ON q.name = s.spec->>'queue'
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

"""

# Migration 0014's settle functions as this migration found them (its reverse puts them back).
SETTLE_FUNCTIONS_0014 = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_steps_settled(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ready bigint[];
    failed_id bigint;
    wf record;
BEGIN
    PERFORM 1 FROM queue_app_workflow
    WHERE id IN (SELECT workflow_id FROM queue_app_workflowstep WHERE id = ANY(ids))
    ORDER BY id FOR UPDATE;
    -- `ended`: the steps of each workflow's current attempt (a late settle of an earlier attempt's step changes
    -- nothing more).
    WITH ended AS (
        SELECT s.id, s.workflow_id, s.state, s.kind,
               s.state = 'succeeded' OR (s.state = 'failed' AND s.on_failure = 'continue') AS proceeds
        FROM queue_app_workflowstep s JOIN queue_app_workflow w ON w.id = s.workflow_id AND w.attempt = s.attempt
        WHERE s.id = ANY(ids)
    ), counts AS (
        SELECT e.downstream_id, count(*) AS n FROM queue_app_stepdependency e
        JOIN ended x ON x.id = e.upstream_id AND x.proceeds
        GROUP BY e.downstream_id
    ), d AS (
        UPDATE queue_app_workflowstep t SET pending = t.pending - c.n
        FROM counts c WHERE t.id = c.downstream_id AND t.state = 'waiting'
        RETURNING t.id, t.pending
    )
    SELECT array_agg(id) INTO ready FROM d WHERE pending = 0;
    FOR wf IN
        WITH ended AS (
            SELECT s.id, s.workflow_id, s.state, s.kind,
                   s.state = 'succeeded' OR (s.state = 'failed' AND s.on_failure = 'continue') AS proceeds
            FROM queue_app_workflowstep s JOIN queue_app_workflow w ON w.id = s.workflow_id AND w.attempt = s.attempt
            WHERE s.id = ANY(ids)
        ), c AS (
            SELECT workflow_id, count(*) AS n, count(*) FILTER (WHERE state <> 'succeeded') AS bad,
                   count(*) FILTER (WHERE state <> 'succeeded' AND kind <> 'compensation') AS bad_steps
            FROM ended GROUP BY workflow_id
        ), old AS (
            SELECT w.id, w.steps_failed, w.state, w.callbacks, w.channel, c.n, c.bad, c.bad_steps
            FROM queue_app_workflow w JOIN c ON c.workflow_id = w.id
        )
        UPDATE queue_app_workflow w
        SET steps_open = w.steps_open - old.n,
            steps_failed = w.steps_failed + CASE WHEN old.state = 'cancelling' THEN 0 ELSE old.bad END
        FROM old WHERE w.id = old.id
        RETURNING w.id, old.steps_failed AS failed_before, old.state AS state_before, old.callbacks, old.channel,
                  old.bad_steps
    LOOP
        IF wf.failed_before = 0 AND wf.bad_steps > 0 AND wf.state_before NOT IN ('cancelling', 'compensating') THEN
            PERFORM queue_app_wf_callback(wf.id, wf.callbacks->'dead', 'failing', wf.channel);
        END IF;
    END LOOP;
    FOR failed_id IN WITH ended AS (
        SELECT s.id, s.workflow_id, s.state, s.kind,
               s.state = 'succeeded' OR (s.state = 'failed' AND s.on_failure = 'continue') AS proceeds
        FROM queue_app_workflowstep s JOIN queue_app_workflow w ON w.id = s.workflow_id AND w.attempt = s.attempt
        WHERE s.id = ANY(ids)
    ) SELECT id FROM ended WHERE NOT proceeds ORDER BY id LOOP
        PERFORM queue_app_wf_step_failed(failed_id);
    END LOOP;
    IF ready IS NOT NULL THEN
        PERFORM queue_app_wf_enqueue(ready, w.channel)
        FROM (SELECT DISTINCT s.workflow_id FROM queue_app_workflowstep s WHERE s.id = ANY(ready)) AS r
        JOIN queue_app_workflow w ON w.id = r.workflow_id;
    END IF;
    PERFORM queue_app_wf_finish(w.id) FROM queue_app_workflow w
    WHERE w.id IN (SELECT workflow_id FROM queue_app_workflowstep WHERE id = ANY(ids)) AND w.steps_open = 0;
END
$$;

-- Each step item that ended (the WHEN of the row trigger below): its step ends the same way, at most once (the
-- row's state is the claim), and is remembered for the statement's end. A Spark step's outcome and result are
-- its run's (state and metrics).
CREATE OR REPLACE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run_id bigint;
    run_state text;
BEGIN
    UPDATE queue_app_workflowstep
    SET state = CASE NEW.state WHEN 'done' THEN 'succeeded' WHEN 'dead' THEN 'failed' ELSE 'cancelled' END,
        result = NEW.result, error = COALESCE(NEW.error, ''), finished_at = now()
    WHERE id = NEW.workflow_step_id AND item_id = NEW.id AND state = 'queued'
    RETURNING spark_run_id INTO run_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF run_id IS NOT NULL THEN
        UPDATE queue_app_workflowstep s
        SET result = r.metrics,
            state = CASE WHEN s.state <> 'succeeded' OR r.state = 'succeeded' THEN s.state
                         WHEN r.state = 'cancelled' THEN 'cancelled' ELSE 'failed' END
        FROM queue_app_sparkrun r WHERE s.id = NEW.workflow_step_id AND r.id = run_id;
    END IF;
    PERFORM set_config('jobsite.workflow_steps_ended',
                       COALESCE(current_setting('jobsite.workflow_steps_ended', true), '')
                       || NEW.workflow_step_id::text || ',', true);
    RETURN NULL;
END
$$;

-- Once per UPDATE statement on queue items: the workflow work of the step items it ended, in one go. For a
-- statement that ended no step item (every plain settle) this is one lookup of a transaction-local setting.
CREATE OR REPLACE FUNCTION queue_app_wf_statement_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended text := current_setting('jobsite.workflow_steps_ended', true);
BEGIN
    IF ended IS NULL OR ended = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('jobsite.workflow_steps_ended', '', true);
    PERFORM queue_app_wf_steps_settled(string_to_array(rtrim(ended, ','), ',')::bigint[]);
    RETURN NULL;
END
$$;

"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0017_partitioned_history"),
    ]

    operations = [
        migrations.AlterField(
            model_name="stepdependency",
            name="downstream",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.DB_CASCADE,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="stepdependency",
            name="upstream",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="compensates",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="workflow",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.DB_CASCADE,
                related_name="steps",
                to="queue_app.workflow",
            ),
        ),
        migrations.RunSQL(
            SETTLE_FUNCTIONS + ENQUEUE_ON_THE_CLOCK,
            SETTLE_FUNCTIONS_0014
            + ENQUEUE_FUNCTION
            + "ALTER TABLE queue_app_workflowstep RESET (fillfactor);",
        ),
    ]
