"""Workflows (issue 20): Workflow, WorkflowStep, StepDependency; QueueItem.workflow_step_id; the settle trigger
and the functions that move a workflow forward inside the transaction that settles a step's item."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


# The workflow engine in the database. Every function runs inside the transaction that settles an item (or
# starts, fans out, cancels or repairs a workflow) and takes the workflow's row lock first: one workflow's
# counters change one transaction at a time, so a step becomes ready exactly once, and a crash rolls back
# everything a settle would have done to its workflow together with the settle.
WORKFLOW_FUNCTIONS = r"""
-- Enqueue the items of the steps named (those still waiting): a Spark step gets its SparkRun and the run's
-- item on the spark queue, any other step an item of its task. Ids come from the tables' sequences first, so
-- one statement writes runs, items and steps. Returns how many steps it enqueued.
CREATE FUNCTION queue_app_wf_enqueue(ids bigint[], channel text) RETURNS integer LANGUAGE plpgsql AS $$
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

-- A workflow-level callback item (spec {"task", "queue", "max_attempts", "payload"}), not a step.
CREATE FUNCTION queue_app_wf_callback(wf_id bigint, spec jsonb, state text, channel text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF spec IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO queue_app_queueitem (queue_id, task, payload, state, priority, run_at, visible_at, attempts,
                                     max_attempts, lease_timeout, error, created_at, updated_at)
    SELECT spec->>'queue', spec->>'task',
           CASE WHEN jsonb_typeof(spec->'payload') = 'object' THEN spec->'payload' ELSE '{}'::jsonb END
               || jsonb_build_object('workflow_id', wf_id, 'state', state),
           'ready', 0, now(), now(), 0, COALESCE((spec->>'max_attempts')::int, q.max_attempts, 5), NULL, '',
           now(), now()
    FROM (SELECT 1) AS one LEFT JOIN queue_app_queue q ON q.name = spec->>'queue';
    PERFORM pg_notify(channel, spec->>'queue');
END
$$;

-- No step of the current attempt is open any more: succeed; or, failed, run the compensations of the
-- completed steps (once: then fail); or end a cancel.
CREATE FUNCTION queue_app_wf_finish(wf_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    w queue_app_workflow%ROWTYPE;
    final text;
    n integer;
    roots bigint[];
BEGIN
    SELECT * INTO w FROM queue_app_workflow WHERE id = wf_id FOR UPDATE;
    IF w.steps_open > 0 OR w.state NOT IN ('running', 'failing', 'compensating', 'cancelling') THEN
        RETURN;
    END IF;
    IF w.state = 'running' AND w.steps_failed = 0 THEN
        final := 'succeeded';
    ELSIF w.state IN ('running', 'failing') THEN
        -- Saga: one compensation step per succeeded step that names one, each after the compensations of the
        -- steps downstream of it (dependencies and fan-out children), so they run in reverse dependency order.
        INSERT INTO queue_app_workflowstep (workflow_id, attempt, name, "group", kind, target, args, spec,
                                            on_failure, compensate, compensates_id, kept, state, pending, error,
                                            created_at)
        SELECT w.id, w.attempt, 'undo ' || st.name, 'undo ' || st."group", 'compensation', st.compensate->>'task',
               st.args,
               st.compensate || jsonb_build_object('payload', jsonb_build_object(
                   'workflow_id', w.id, 'step', st.name, 'args', st.args, 'result', st.result)),
               'continue', NULL, st.id, false, 'waiting', 0, '', now()
        FROM queue_app_workflowstep st
        WHERE st.workflow_id = w.id AND st.attempt = w.attempt AND st.state = 'succeeded'
          AND st.kind <> 'compensation' AND st.compensate IS NOT NULL;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            WITH RECURSIVE steps AS (
                SELECT id, parent_id FROM queue_app_workflowstep
                WHERE workflow_id = w.id AND attempt = w.attempt AND kind <> 'compensation'
            ), edge(up, down) AS (
                SELECT d.upstream_id, d.downstream_id FROM queue_app_stepdependency d JOIN steps s ON s.id = d.upstream_id
                UNION SELECT parent_id, id FROM steps WHERE parent_id IS NOT NULL
            ), below(anc, des) AS (
                SELECT up, down FROM edge
                UNION SELECT b.anc, e.down FROM below b JOIN edge e ON e.up = b.des
            ), comp AS (
                SELECT id, compensates_id FROM queue_app_workflowstep
                WHERE workflow_id = w.id AND attempt = w.attempt AND kind = 'compensation'
            ), ins AS (
                INSERT INTO queue_app_stepdependency (upstream_id, downstream_id)
                SELECT DISTINCT cd.id, ca.id FROM below b
                JOIN comp ca ON ca.compensates_id = b.anc JOIN comp cd ON cd.compensates_id = b.des
                RETURNING downstream_id
            )
            UPDATE queue_app_workflowstep st SET pending = c.n
            FROM (SELECT downstream_id, count(*) AS n FROM ins GROUP BY downstream_id) c
            WHERE st.id = c.downstream_id;
            UPDATE queue_app_workflow SET state = 'compensating', steps_open = n, steps_total = steps_total + n
            WHERE id = w.id;
            SELECT array_agg(id) INTO roots FROM queue_app_workflowstep
            WHERE workflow_id = w.id AND attempt = w.attempt AND kind = 'compensation' AND state = 'waiting'
              AND pending = 0;
            PERFORM queue_app_wf_enqueue(roots, w.channel);
            RETURN;
        END IF;
        final := 'failed';
    ELSIF w.state = 'compensating' THEN
        final := 'failed';
    ELSE
        final := 'cancelled';
    END IF;
    UPDATE queue_app_workflow SET state = final, finished_at = now() WHERE id = w.id;
    IF final = 'succeeded' THEN
        PERFORM queue_app_wf_callback(w.id, w.callbacks->'done', final, w.channel);
    END IF;
    PERFORM queue_app_wf_callback(w.id, w.callbacks->'finished', final, w.channel);
END
$$;

-- A step of the workflow ended (succeeded, failed or cancelled): its dependents' counts go down, and those at
-- zero are enqueued; a failure cancels what can no longer run (downstream of it; with on_failure 'fail',
-- everything not started). The caller holds the workflow's row lock.
CREATE FUNCTION queue_app_wf_settle_step(step_id bigint, outcome text, res jsonb, err text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    st queue_app_workflowstep%ROWTYPE;
    w queue_app_workflow%ROWTYPE;
    closed integer := 1;
    failed integer := 0;
    n integer;
    ready bigint[];
    new_state text;
BEGIN
    UPDATE queue_app_workflowstep SET state = outcome, result = res, error = COALESCE(err, ''),
        finished_at = now()
    WHERE id = step_id RETURNING * INTO st;
    SELECT * INTO w FROM queue_app_workflow WHERE id = st.workflow_id;
    IF st.attempt <> w.attempt THEN
        RETURN;  -- a late settle of an earlier attempt's step: recorded, nothing else
    END IF;
    new_state := w.state;
    IF outcome = 'succeeded' OR (outcome = 'failed' AND st.on_failure = 'continue') THEN
        WITH d AS (
            UPDATE queue_app_workflowstep s SET pending = s.pending - 1
            FROM queue_app_stepdependency e
            WHERE e.upstream_id = step_id AND s.id = e.downstream_id AND s.state = 'waiting'
            RETURNING s.id, s.pending
        )
        SELECT array_agg(id) INTO ready FROM d WHERE pending = 0;
    ELSE
        WITH RECURSIVE down(id) AS (
            SELECT downstream_id FROM queue_app_stepdependency WHERE upstream_id = step_id
            UNION SELECT e.downstream_id FROM queue_app_stepdependency e JOIN down ON e.upstream_id = down.id
        ), gone AS (
            UPDATE queue_app_workflowstep s SET state = 'cancelled', finished_at = now(),
                error = 'not run: a step it depends on did not succeed'
            FROM down WHERE s.id = down.id AND s.state = 'waiting'
            RETURNING s.id
        )
        SELECT count(*) INTO n FROM gone;
        closed := closed + n;
    END IF;
    IF outcome <> 'succeeded' AND w.state <> 'cancelling' THEN
        failed := 1;
        IF w.steps_failed = 0 AND st.kind <> 'compensation' THEN
            PERFORM queue_app_wf_callback(w.id, w.callbacks->'dead', 'failing', w.channel);
        END IF;
        IF st.on_failure = 'fail' AND w.state = 'running' THEN
            new_state := 'failing';
            WITH gone AS (
                UPDATE queue_app_workflowstep s SET state = 'cancelled', finished_at = now(),
                    error = 'not run: the workflow failed at ' || st.name
                WHERE s.workflow_id = w.id AND s.attempt = w.attempt AND s.state = 'waiting'
                RETURNING s.id
            )
            SELECT count(*) INTO n FROM gone;
            closed := closed + n;
            -- Queued but not started (its item still ready): cancelled with its item and Spark run.
            WITH q AS (
                UPDATE queue_app_workflowstep s SET state = 'cancelled', finished_at = now(),
                    error = 'not started: the workflow failed at ' || st.name
                FROM queue_app_queueitem i
                WHERE s.workflow_id = w.id AND s.attempt = w.attempt AND s.state = 'queued'
                  AND i.id = s.item_id AND i.state = 'ready'
                RETURNING s.item_id, s.spark_run_id
            ), items AS (
                UPDATE queue_app_queueitem SET state = 'cancelled', finished_at = now(), updated_at = now(),
                    error = 'cancelled: the workflow failed'
                WHERE id IN (SELECT item_id FROM q) AND state = 'ready'
            ), runs AS (
                UPDATE queue_app_sparkrun SET state = 'cancelled', finished_at = now(),
                    error = 'cancelled before it started: the workflow failed'
                WHERE id IN (SELECT spark_run_id FROM q) AND state = 'queued'
            )
            SELECT count(*) INTO n FROM q;
            closed := closed + n;
        END IF;
    END IF;
    UPDATE queue_app_workflow SET steps_open = steps_open - closed, steps_failed = steps_failed + failed,
        state = new_state
    WHERE id = w.id RETURNING * INTO w;
    IF ready IS NOT NULL THEN
        PERFORM queue_app_wf_enqueue(ready, w.channel);
    END IF;
    IF w.steps_open = 0 THEN
        PERFORM queue_app_wf_finish(w.id);
    END IF;
END
$$;

-- AFTER UPDATE OF state on queue items, for items that carry a step (WHEN below): the item ended, so its step
-- does. Runs in the settling statement's transaction, whichever path settled it (batch complete, fail, dead
-- letter, rescue, cancel). A Spark step's outcome and result are its run's (state and metrics).
CREATE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    st queue_app_workflowstep%ROWTYPE;
    outcome text;
    res jsonb;
    run_state text;
BEGIN
    SELECT * INTO st FROM queue_app_workflowstep WHERE id = NEW.workflow_step_id;
    IF NOT FOUND OR st.item_id IS DISTINCT FROM NEW.id THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM queue_app_workflow WHERE id = st.workflow_id FOR UPDATE;  -- the workflow's mutex
    SELECT * INTO st FROM queue_app_workflowstep WHERE id = NEW.workflow_step_id;  -- as of the lock
    IF st.state <> 'queued' OR st.item_id IS DISTINCT FROM NEW.id THEN
        RETURN NULL;
    END IF;
    outcome := CASE NEW.state WHEN 'done' THEN 'succeeded' WHEN 'dead' THEN 'failed' ELSE 'cancelled' END;
    res := NEW.result;
    IF st.kind = 'spark' THEN
        SELECT r.state, r.metrics INTO run_state, res FROM queue_app_sparkrun r WHERE r.id = st.spark_run_id;
        IF outcome = 'succeeded' AND run_state IS DISTINCT FROM 'succeeded' THEN
            outcome := CASE WHEN run_state = 'cancelled' THEN 'cancelled' ELSE 'failed' END;
        END IF;
    END IF;
    PERFORM queue_app_wf_settle_step(st.id, outcome, res, NEW.error);
    RETURN NULL;
END
$$;

CREATE TRIGGER workflow_step_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
    WHEN (NEW.workflow_step_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION queue_app_wf_item_settled();
"""

DROP_WORKFLOW_FUNCTIONS = """
DROP TRIGGER workflow_step_settled ON queue_app_queueitem;
DROP FUNCTION queue_app_wf_item_settled();
DROP FUNCTION queue_app_wf_settle_step(bigint, text, jsonb, text);
DROP FUNCTION queue_app_wf_finish(bigint);
DROP FUNCTION queue_app_wf_callback(bigint, jsonb, text, text);
DROP FUNCTION queue_app_wf_enqueue(bigint[], text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('queue_app', '0010_reservation_hot_settle'),
    ]

    operations = [
        migrations.AddField(
            model_name='queueitem',
            name='workflow_step_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='sparkrun',
            name='trigger',
            field=models.CharField(choices=[('dashboard', 'Dashboard'), ('schedule', 'Schedule'), ('orm', 'Orm'), ('cli', 'Cli'), ('workflow', 'Workflow')], default='orm', max_length=12),
        ),
        migrations.CreateModel(
            name='Workflow',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200)),
                ('kind', models.CharField(choices=[('workflow', 'Workflow'), ('backfill', 'Backfill'), ('batch', 'Batch')], default='workflow', max_length=10)),
                ('params', models.JSONField(blank=True, default=dict)),
                ('state', models.CharField(choices=[('running', 'Running'), ('failing', 'Failing'), ('compensating', 'Compensating'), ('cancelling', 'Cancelling'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='running', max_length=12)),
                ('attempt', models.PositiveIntegerField(default=1)),
                ('started_by', models.CharField(blank=True, default='', max_length=150)),
                ('steps_total', models.PositiveIntegerField(default=0)),
                ('steps_open', models.PositiveIntegerField(default=0)),
                ('steps_failed', models.PositiveIntegerField(default=0)),
                ('callbacks', models.JSONField(blank=True, default=dict)),
                ('channel', models.CharField(default='jobsite_queue', max_length=63)),
                ('error', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['-id'],
                'permissions': [('start_workflow', 'Can start workflows and backfills'), ('cancel_workflow', 'Can cancel workflows'), ('repair_workflow', 'Can repair workflows')],
                'indexes': [models.Index(models.F('name'), models.OrderBy(models.F('id'), descending=True), name='workflow_name'), models.Index(models.F('state'), name='workflow_state')],
            },
        ),
        migrations.CreateModel(
            name='WorkflowStep',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('attempt', models.PositiveIntegerField()),
                ('name', models.CharField(max_length=200)),
                ('group', models.CharField(help_text='Sibling name: the steps of one fan-out share it.', max_length=200)),
                ('kind', models.CharField(choices=[('task', 'Task'), ('spark', 'Spark'), ('compensation', 'Compensation')], max_length=12)),
                ('target', models.CharField(help_text='Task name or Spark job name.', max_length=200)),
                ('args', models.JSONField(blank=True, null=True)),
                ('spec', models.JSONField(default=dict)),
                ('on_failure', models.CharField(choices=[('fail', 'Fail the workflow and cancel what has not started'), ('continue', 'Continue: its dependents run anyway')], default='fail', max_length=10)),
                ('compensate', models.JSONField(blank=True, help_text='Item spec of the compensation task.', null=True)),
                ('kept', models.BooleanField(default=False, help_text='Succeeded in an earlier attempt; kept by a repair.')),
                ('state', models.CharField(choices=[('waiting', 'Waiting'), ('queued', 'Queued'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='waiting', max_length=10)),
                ('pending', models.PositiveIntegerField(default=0, help_text='Dependencies not finished yet.')),
                ('item_id', models.BigIntegerField(blank=True, null=True)),
                ('spark_run_id', models.BigIntegerField(blank=True, null=True)),
                ('result', models.JSONField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('ready_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('compensates', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='queue_app.workflowstep')),
                ('parent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='queue_app.workflowstep')),
                ('workflow', models.ForeignKey(on_delete=django.db.models.deletion.DB_CASCADE, related_name='steps', to='queue_app.workflow')),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.CreateModel(
            name='StepDependency',
            fields=[
                ('pk', models.CompositePrimaryKey('upstream_id', 'downstream_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('order_only', models.BooleanField(db_default=False, default=False)),
                ('downstream', models.ForeignKey(on_delete=django.db.models.deletion.DB_CASCADE, related_name='+', to='queue_app.workflowstep')),
                ('upstream', models.ForeignKey(on_delete=django.db.models.deletion.DB_CASCADE, related_name='+', to='queue_app.workflowstep')),
            ],
        ),
        migrations.AddIndex(
            model_name='workflowstep',
            index=models.Index(condition=models.Q(('item_id__isnull', False)), fields=['item_id'], name='workflowstep_item'),
        ),
        migrations.AddConstraint(
            model_name='workflowstep',
            constraint=models.UniqueConstraint(models.F('workflow'), models.F('attempt'), models.F('name'), name='workflowstep_name'),
        ),
        migrations.AddIndex(
            model_name='stepdependency',
            index=models.Index(models.F('downstream'), name='stepdependency_downstream'),
        ),

        migrations.AlterField(
            model_name='schedule',
            name='catch_up',
            field=models.CharField(choices=[('skip', 'Skip missed fire times'), ('once', 'Latest only: fire once, for the latest missed fire time'), ('all', 'All: fire every missed fire time (at most the latest 100)')], default='skip', max_length=10),
        ),
        migrations.AlterField(
            model_name='schedule',
            name='target_kind',
            field=models.CharField(choices=[('task', 'Registered task'), ('spark', 'Spark job'), ('workflow', 'Workflow')], default='task', max_length=10),
        ),
        migrations.RunSQL(WORKFLOW_FUNCTIONS, DROP_WORKFLOW_FUNCTIONS),
    ]
