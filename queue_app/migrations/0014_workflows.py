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

-- A step that failed (with on_failure 'fail') or was cancelled: what waits for it can never run and is cancelled;
-- unless the workflow is being cancelled anyway, the workflow fails: everything not started is cancelled (a
-- queued step whose item is still ready, with its item and Spark run), running steps finish. The caller holds
-- the workflow's row lock and has counted the step itself.
CREATE FUNCTION queue_app_wf_step_failed(step_id bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    st queue_app_workflowstep%ROWTYPE;
    w queue_app_workflow%ROWTYPE;
    closed integer;
    n integer;
BEGIN
    SELECT * INTO st FROM queue_app_workflowstep WHERE id = step_id;
    SELECT * INTO w FROM queue_app_workflow WHERE id = st.workflow_id;
    WITH RECURSIVE down(id) AS (
        SELECT downstream_id FROM queue_app_stepdependency WHERE upstream_id = step_id
        UNION SELECT e.downstream_id FROM queue_app_stepdependency e JOIN down ON e.upstream_id = down.id
    ), gone AS (
        UPDATE queue_app_workflowstep s SET state = 'cancelled', finished_at = now(),
            error = 'not run: ' || st.name || ', a step it depends on, did not succeed'
        FROM down WHERE s.id = down.id AND s.state = 'waiting'
        RETURNING s.id
    )
    SELECT count(*) INTO closed FROM gone;
    IF w.state = 'running' AND st.kind <> 'compensation' THEN
        UPDATE queue_app_workflow SET state = 'failing', error = 'failed at step ' || st.name WHERE id = w.id;
        WITH gone AS (
            UPDATE queue_app_workflowstep s SET state = 'cancelled', finished_at = now(),
                error = 'not run: the workflow failed at ' || st.name
            WHERE s.workflow_id = w.id AND s.attempt = w.attempt AND s.state = 'waiting'
            RETURNING s.id
        )
        SELECT count(*) INTO n FROM gone;
        closed := closed + n;
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
    UPDATE queue_app_workflow SET steps_open = steps_open - closed WHERE id = w.id;
END
$$;

-- The steps named ended (their rows already say how): in one go per statement, under each workflow's row lock
-- (taken in id order, so two settling transactions never wait for each other in a cycle), the steps waiting
-- for them count down (one UPDATE per waiting step, whatever the number of its dependencies that ended here),
-- those at zero are enqueued, the workflows' counters move, failures cancel what can no longer run, and a
-- workflow with no open step left ends.
CREATE FUNCTION queue_app_wf_steps_settled(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
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
CREATE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE FUNCTION queue_app_wf_statement_settled() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER workflow_step_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
    WHEN (NEW.workflow_step_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION queue_app_wf_item_settled();
CREATE TRIGGER workflow_steps_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH STATEMENT
    EXECUTE FUNCTION queue_app_wf_statement_settled();
"""

DROP_WORKFLOW_FUNCTIONS = """
DROP TRIGGER workflow_steps_settled ON queue_app_queueitem;
DROP TRIGGER workflow_step_settled ON queue_app_queueitem;
DROP FUNCTION queue_app_wf_statement_settled();
DROP FUNCTION queue_app_wf_item_settled();
DROP FUNCTION queue_app_wf_steps_settled(bigint[]);
DROP FUNCTION queue_app_wf_step_failed(bigint);
DROP FUNCTION queue_app_wf_finish(bigint);
DROP FUNCTION queue_app_wf_callback(bigint, jsonb, text, text);
DROP FUNCTION queue_app_wf_enqueue(bigint[], text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('queue_app', '0013_webhooks'),
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
