"""The workflow engine's SQL gets one home (issue 36): queue_app/workflows/sql.py holds the current text of
every function and trigger; this migration installs a frozen copy of it as it is today. A later change to that
module comes with a migration of its own holding a copy of what changed
(tests/workflows/in_process/test_workflow_sql_source.py fails until the migrated database and the module agree).

What changes in the database:
- An item a workflow makes (a step's, a callback's, a fan-out's) is written by one piece of SQL
  (workflows/sql.py, _items_from_specs). Its attempts, when neither its task nor its queue names them, are the
  workflow's `default_max_attempts`: the JOBSITE DEFAULT_MAX_ATTEMPTS setting when it started or was last
  repaired (existing workflows get the setting as this migration runs), no longer a literal 5. A callback item
  now also takes its task's declared priority and lease timeout, as a step's item does.
- queue_app_wf_step_failed cancels the ready items of a failed workflow first, then their steps by what that
  UPDATE returned: an item a worker leased meanwhile runs with its step, where before its step could be marked
  cancelled while the item ran anyway.
"""

from django.db import migrations, models

import queue_app.workflows.models

# queue_app/workflows/sql.py INSTALL as of this migration (frozen: never import it from there).
INSTALL = r"""
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

CREATE OR REPLACE FUNCTION queue_app_wf_finish(wf_id bigint) RETURNS void LANGUAGE plpgsql AS $$
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
                SELECT d.upstream_id, d.downstream_id
                FROM queue_app_stepdependency d JOIN steps s ON s.id = d.upstream_id
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

CREATE OR REPLACE FUNCTION queue_app_wf_step_failed(step_id bigint) RETURNS void LANGUAGE plpgsql AS $$
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
        WITH items AS (
            UPDATE queue_app_queueitem i SET state = 'cancelled', finished_at = now(), updated_at = now(),
                error = 'cancelled: the workflow failed'
            FROM queue_app_workflowstep s
            WHERE s.workflow_id = w.id AND s.attempt = w.attempt AND s.state = 'queued'
              AND i.id = s.item_id AND i.state = 'ready'
            RETURNING i.id
        ), q AS (
            UPDATE queue_app_workflowstep s SET state = 'cancelled', finished_at = now(),
                error = 'not started: the workflow failed at ' || st.name
            FROM items
            WHERE s.item_id = items.id AND s.workflow_id = w.id AND s.attempt = w.attempt AND s.state = 'queued'
            RETURNING s.spark_run_id
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

CREATE OR REPLACE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobsite.workflow_items_ended',
                       COALESCE(current_setting('jobsite.workflow_items_ended', true), '') || NEW.id::text || ',',
                       true);
    RETURN NULL;
END
$$;

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

CREATE OR REPLACE FUNCTION queue_app_workflow_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_app_stepdependency d USING queue_app_workflowstep s, gone g
    WHERE s.workflow_id = g.id AND d.downstream_id = s.id;
    DELETE FROM queue_app_workflowstep s USING gone g WHERE s.workflow_id = g.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER workflow_step_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
    WHEN (NEW.workflow_step_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION queue_app_wf_item_settled();
CREATE OR REPLACE TRIGGER workflow_steps_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH STATEMENT
    EXECUTE FUNCTION queue_app_wf_statement_settled();
CREATE OR REPLACE TRIGGER workflow_deleted AFTER DELETE ON queue_app_workflow REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION queue_app_workflow_deleted();
"""

# The functions as migrations 0014, 0018 and 0019 left them (pg_get_functiondef), for the reverse. The triggers
# are the same before and after.
PREVIOUS = r"""
CREATE OR REPLACE FUNCTION public.queue_app_wf_callback(wf_id bigint, spec jsonb, state text, channel text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_wf_enqueue(ids bigint[], channel text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_wf_finish(wf_id bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
                SELECT d.upstream_id, d.downstream_id FROM queue_app_stepdependency d JOIN steps s ON s.id =
                d.upstream_id UNION SELECT parent_id, id FROM steps WHERE parent_id IS NOT NULL
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
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_wf_item_settled()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM set_config('jobsite.workflow_items_ended',
                       COALESCE(current_setting('jobsite.workflow_items_ended', true), '') || NEW.id::text || ',',
                       true);
    RETURN NULL;
END
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_wf_statement_settled()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_wf_step_failed(step_id bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_wf_steps_ended(a_id bigint[], a_workflow bigint[], a_attempt integer[],
a_state text[], a_kind text[], a_proceeds boolean[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$
;
CREATE OR REPLACE FUNCTION public.queue_app_workflow_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    DELETE FROM queue_app_stepdependency d USING queue_app_workflowstep s, gone g
    WHERE s.workflow_id = g.id AND d.downstream_id = s.id;
    DELETE FROM queue_app_workflowstep s USING gone g WHERE s.workflow_id = g.id;
    RETURN NULL;
END
$function$
;

"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0020_id_marks"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflow",
            name="default_max_attempts",
            field=models.PositiveIntegerField(default=queue_app.workflows.models.default_max_attempts),
        ),
        migrations.RunSQL(INSTALL, PREVIOUS),
    ]
