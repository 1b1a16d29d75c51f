"""Conditions (issue 39): run-if rules per step and branch steps. A step may end `skipped`; the settle trigger
decides, under the workflow's row lock, the conditional steps whose dependencies all ended
(queue_app_wf_decide), called from queue_app_wf_steps_ended only when one of them is marked conditional in its
spec.
"""

from django.db import migrations, models

# queue_app/workflows/sql.py texts changed and added here (frozen: never import them from there).
INSTALL = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_steps_ended(a_id bigint[], a_workflow bigint[], a_attempt int[],
                                                    a_state text[], a_kind text[], a_proceeds boolean[])
RETURNS void LANGUAGE plpgsql AS $$
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
    decide boolean;
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
            RETURNING t.id, t.pending, t.spec ? 'run_if' AS conditional
        )
        SELECT array_agg(id), bool_or(conditional) INTO ready, decide FROM d WHERE pending = 0;
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
    IF decide THEN
        ready := queue_app_wf_decide(ready);
    END IF;
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

CREATE OR REPLACE FUNCTION queue_app_wf_decide(ready bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    run bigint[] := '{}';
    todo bigint[] := ready;
    skip bigint[];
    go bigint[];
BEGIN
    WHILE todo IS NOT NULL LOOP
        WITH s AS (
            SELECT s.id, s.name, s.spec->>'run_if' AS rule FROM queue_app_workflowstep s
            WHERE s.id = ANY(todo) AND s.state = 'waiting' AND s.spec ? 'run_if'
        ), up AS (
            SELECT s.id, s.rule, count(u.id) AS n, count(u.id) FILTER (WHERE u.state = 'skipped') AS skipped,
                   count(u.id) FILTER (WHERE u.state = 'failed') AS failed,
                   COALESCE(bool_or(u.spec ? 'branch' AND NOT (u.state = 'succeeded' AND COALESCE(
                       CASE jsonb_typeof(u.result) WHEN 'array' THEN u.result
                                                   WHEN 'string' THEN jsonb_build_array(u.result)
                                                   WHEN 'object' THEN u.result->'chosen' END ? s.name, false))),
                            false) AS unchosen
            FROM s LEFT JOIN queue_app_stepdependency d ON d.downstream_id = s.id AND NOT d.order_only
            LEFT JOIN queue_app_workflowstep u ON u.id = d.upstream_id
            GROUP BY s.id, s.rule
        )
        SELECT array_agg(id) FILTER (WHERE skipping), array_agg(id) FILTER (WHERE NOT skipping) INTO skip, go
        FROM (SELECT id, unchosen OR (n > 0 AND skipped = n) OR CASE rule
                  WHEN 'all_done' THEN false
                  WHEN 'any_failed' THEN failed = 0
                  WHEN 'none_failed' THEN failed > 0
                  ELSE skipped > 0 END AS skipping
              FROM up) v;
        run := run || COALESCE(go, '{}') || ARRAY(
            SELECT x.id FROM unnest(todo) AS x(id) JOIN queue_app_workflowstep s ON s.id = x.id
            WHERE s.state = 'waiting' AND NOT s.spec ? 'run_if');
        todo := NULL;
        IF skip IS NOT NULL THEN
            WITH gone AS (
                UPDATE queue_app_workflowstep s SET state = 'skipped', finished_at = now(),
                    error = 'skipped: its run_if (' || COALESCE(s.spec->>'run_if', 'all_succeeded') || ') was not met'
                WHERE s.id = ANY(skip) AND s.state = 'waiting'
                RETURNING s.workflow_id
            )
            UPDATE queue_app_workflow w SET steps_open = w.steps_open - c.n
            FROM (SELECT workflow_id, count(*) AS n FROM gone GROUP BY workflow_id) c WHERE w.id = c.workflow_id;
            WITH d AS (
                UPDATE queue_app_workflowstep t SET pending = t.pending - c.n
                FROM (SELECT downstream_id, count(*)::int AS n FROM queue_app_stepdependency
                      WHERE upstream_id = ANY(skip) GROUP BY downstream_id) c
                WHERE t.id = c.downstream_id AND t.state = 'waiting'
                RETURNING t.id, t.pending
            )
            SELECT array_agg(id) INTO todo FROM d WHERE pending = 0;
        END IF;
    END LOOP;
    RETURN CASE WHEN cardinality(run) > 0 THEN run END;
END
$$;
"""
# The texts as 0021/0024 left them.
DROP = r"""
CREATE OR REPLACE FUNCTION queue_app_wf_steps_ended(a_id bigint[], a_workflow bigint[], a_attempt int[],
                                                    a_state text[], a_kind text[], a_proceeds boolean[])
RETURNS void LANGUAGE plpgsql AS $$
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
DROP FUNCTION IF EXISTS queue_app_wf_decide(bigint[]);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0031_dataset_lineage"),
    ]

    operations = [
        migrations.AlterField(
            model_name="workflowstep",
            name="state",
            field=models.CharField(
                choices=[
                    ("waiting", "Waiting"),
                    ("queued", "Queued"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("skipped", "Skipped"),
                ],
                default="waiting",
                max_length=10,
            ),
        ),
        migrations.RunSQL(INSTALL, DROP),
    ]
