"""Workflow settles read less (issue 20's per-step cost goal).

- A settle batch's ended steps come from the UPDATE that ends them (its RETURNING), no longer read again by
  primary key twice (once to lock their workflows, once for their states).
- Their downstream steps' pending counts are lowered through the downstream steps' primary key. Migration 0018's
  statement joined the counted steps to every `waiting` step of the table: on statistics older than a fan-out
  the planner hashed them and read the whole step table once per settle batch (6.8 ms a batch at 20,000 step
  rows in queue_bench's workflow part).
- The last two foreign key constraints on workflow rows (a step's workflow, an edge's downstream step) go: each
  checked every row at commit (a third of a 10,000-step fan-out's time), and every such row is written under its
  workflow's row lock, so none can dangle. Their cascade becomes the statement trigger workflow_deleted: a deleted
  workflow takes its steps and their edges (every edge joins two steps of one workflow) with it.
"""

import django.db.models.deletion
from django.db import migrations, models

# Migration 0018's functions as this migration found them (its reverse puts them back): a frozen copy, like
# every function text in a migration (the current ones live in queue_app/workflows/sql.py).
OLD_FUNCTIONS = r"""
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

"""

SETTLE_FUNCTIONS = r"""
DROP FUNCTION queue_app_wf_steps_settled(bigint[]);

-- Once per UPDATE statement on queue items: the steps of the step items it ended end the same way, in one
-- UPDATE, each at most once (the step row's state is the claim); a Spark step's outcome and result are its
-- run's (state and metrics). The UPDATE returns what moving their workflows forward needs
-- (queue_app_wf_steps_ended). For a statement that ended no step item (every plain settle) this is one lookup
-- of a transaction-local setting.
CREATE OR REPLACE FUNCTION queue_app_wf_statement_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended text := current_setting('jobsite.workflow_items_ended', true);
    a_id bigint[];
    a_workflow bigint[];
    a_attempt int[];
    a_state text[];
    a_kind text[];
    a_proceeds boolean[];
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
        RETURNING s.id, s.workflow_id, s.attempt, s.state, s.kind,
                  s.state = 'succeeded' OR (s.state = 'failed' AND s.on_failure = 'continue') AS proceeds
    )
    SELECT array_agg(id ORDER BY id), array_agg(workflow_id ORDER BY id), array_agg(attempt ORDER BY id),
           array_agg(state ORDER BY id), array_agg(kind ORDER BY id), array_agg(proceeds ORDER BY id)
    INTO a_id, a_workflow, a_attempt, a_state, a_kind, a_proceeds
    FROM settled;
    IF a_id IS NOT NULL THEN
        PERFORM queue_app_wf_steps_ended(a_id, a_workflow, a_attempt, a_state, a_kind, a_proceeds);
    END IF;
    RETURN NULL;
END
$$;

-- The steps that just ended, as their ending UPDATE returned them: in one go per statement under each
-- workflow's row lock (taken in id order). Only the steps of each workflow's current attempt count (a late
-- settle of an earlier attempt's step changes nothing more). Downstream steps' pending counts are lowered
-- through their primary key (whatever the statistics say), and those reaching 0 are enqueued.
CREATE FUNCTION queue_app_wf_steps_ended(a_id bigint[], a_workflow bigint[], a_attempt int[], a_state text[],
                                         a_kind text[], a_proceeds boolean[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e_id bigint[];
    e_workflow bigint[];
    e_state text[];
    e_kind text[];
    e_proceeds boolean[];
    c_id bigint[];
    c_n int[];
    ready bigint[];
    failed_id bigint;
    wf record;
BEGIN
    PERFORM 1 FROM queue_app_workflow WHERE id = ANY(a_workflow) ORDER BY id FOR UPDATE;
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.workflow_id ORDER BY x.id), array_agg(x.state ORDER BY x.id),
           array_agg(x.kind ORDER BY x.id), array_agg(x.proceeds ORDER BY x.id)
    INTO e_id, e_workflow, e_state, e_kind, e_proceeds
    FROM unnest(a_id, a_workflow, a_attempt, a_state, a_kind, a_proceeds)
         AS x(id, workflow_id, attempt, state, kind, proceeds)
    WHERE x.attempt = (SELECT w.attempt FROM queue_app_workflow w WHERE w.id = x.workflow_id);
    IF e_id IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(c.downstream_id), array_agg(c.n) INTO c_id, c_n
    FROM (SELECT d.downstream_id, count(*)::int AS n
          FROM unnest(e_id, e_proceeds) AS x(id, proceeds) JOIN queue_app_stepdependency d ON d.upstream_id = x.id
          WHERE x.proceeds
          GROUP BY d.downstream_id) c;
    IF c_id IS NOT NULL THEN
        WITH d AS (
            UPDATE queue_app_workflowstep t SET pending = t.pending - c.n
            FROM unnest(c_id, c_n) AS c(id, n) WHERE t.id = c.id AND t.state = 'waiting'
            RETURNING t.id, t.pending
        )
        SELECT array_agg(id) INTO ready FROM d WHERE pending = 0;
    END IF;
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
"""
UNSETTLE_FUNCTIONS = "DROP FUNCTION queue_app_wf_steps_ended(bigint[], bigint[], int[], text[], text[], boolean[]);\n"

CASCADE = """
CREATE FUNCTION queue_app_workflow_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_app_stepdependency d USING queue_app_workflowstep s, gone g
    WHERE s.workflow_id = g.id AND d.downstream_id = s.id;
    DELETE FROM queue_app_workflowstep s USING gone g WHERE s.workflow_id = g.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER workflow_deleted AFTER DELETE ON queue_app_workflow REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION queue_app_workflow_deleted();
"""
UNCASCADE = """
DROP TRIGGER workflow_deleted ON queue_app_workflow;
DROP FUNCTION queue_app_workflow_deleted();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0018_workflow_settle_set_based"),
    ]

    operations = [
        migrations.RunSQL(SETTLE_FUNCTIONS, UNSETTLE_FUNCTIONS + OLD_FUNCTIONS),
        migrations.AlterField(
            model_name="workflowstep",
            name="workflow",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="steps",
                to="queue_app.workflow",
            ),
        ),
        migrations.AlterField(
            model_name="stepdependency",
            name="downstream",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.RunSQL(CASCADE, UNCASCADE),
    ]
