"""The workflow engine's SQL, in one home: the current text of every function and trigger that moves a workflow
forward inside the transaction that settles a step's item, and the statements the services run (start, fan-out,
cancel, repair).

The database runs what migrations installed, and a migration is frozen: each holds a literal copy of the texts
it installs (never importing them from here or from another migration). The latest copies are in migrations
0021_workflow_sql_one_home, 0024_workflow_waits, 0027_workflow_approvals, 0032_workflow_conditions,
0033_workflow_versions and 0043_sub48_subworkflows.
tests/workflows/in_process/test_workflow_sql_source.py compares every `queue_app_wf_*` function and workflow trigger of
a migrated database with this module, so a change here needs a new migration holding a copy of the changed texts (CREATE
OR REPLACE), and a migration cannot change them without this module following.

Every function runs inside the transaction that settles an item (or starts, fans out, cancels or repairs a
workflow) and takes the workflow's row lock first: one workflow's counters change one transaction at a time, so
a step becomes ready exactly once, and a crash rolls back everything a settle would have done to its workflow
together with the settle. The path of a settle: the row trigger workflow_step_settled remembers each step item
that ended (queue_app_wf_item_settled), the statement trigger workflow_steps_settled ends their steps in one
UPDATE (queue_app_wf_statement_settled), then queue_app_wf_steps_ended counts down what waits for them, enqueues
the steps that reach zero (queue_app_wf_enqueue), cancels what a failure leaves unable to run
(queue_app_wf_step_failed) and ends workflows with no open step (queue_app_wf_finish, queue_app_wf_callback).
"""

import textwrap

from ..engine.sql import ITEM, ITEM_SEQUENCE, QUEUE

WORKFLOW = "queue_app_workflow"
STEP_SEQUENCE = "queue_app_workflowstep_id_seq"  # the id sequence of steps (checked by a test, as ITEM_SEQUENCE)


def _items_from_specs(
    rows: str, *, spec: str, payload: str, item_id: str, step_id: str, attempts: str, trace: str
) -> str:
    """The step-spec-to-item SQL, written only here: an INSERT of one ready item per row of `rows` from an item
    spec {"task", "queue", "max_attempts", "priority", "lease_timeout"} (workflows.definition.task_item_spec).
    Its attempts are the spec's (the task's declaration), else its queue's, else `attempts`: the workflow's
    default_max_attempts, which its start (and each repair) copies from the JOBSITE DEFAULT_MAX_ATTEMPTS setting,
    as it copies the NOTIFY channel. The settle trigger that enqueues most steps runs in whatever connection
    settles an item, with no Python to ask; a value written into this text would freeze the setting as it was
    when the migration ran, and a session setting would be missing on connections the project did not open.
    A spec with "delay" (seconds) or "until" (a time) makes a delayed item, due that long after now or then (a
    sleep step's, an event wait's timeout): it holds no worker and no connection until it is due.
    `trace`: the item's trace context (engine/tracing.py), the workflow's (its start span's) or the fan-out's
    caller's; NULL with tracing off."""
    due = (
        f"GREATEST(now(), COALESCE(({spec}->>'until')::timestamptz,\n"
        f"           now() + make_interval(secs => COALESCE(({spec}->>'delay')::float8, 0))))"
    )
    return f"""\
INSERT INTO {ITEM} (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
    max_attempts, lease_timeout, error, created_at, updated_at, workflow_step_id, trace_context)
SELECT {item_id}, {spec}->>'queue', {spec}->>'task',
       {payload},
       'ready', COALESCE(({spec}->>'priority')::smallint, 0), due.at, due.at, 0,
       COALESCE(({spec}->>'max_attempts')::int, q.max_attempts, {attempts}),
       ({spec}->>'lease_timeout')::float8, '', now(), now(), {step_id}, {trace}
FROM {rows}
LEFT JOIN {QUEUE} q ON q.name = {spec}->>'queue'
CROSS JOIN LATERAL (SELECT {due} AS at) AS due"""


def _at(indent: int, text: str) -> str:
    return textwrap.indent(text, " " * indent).lstrip()


# The three places a workflow makes items: a step's (queue_app_wf_enqueue), a callback's (queue_app_wf_callback)
# and a fan-out's (WORKFLOW_FAN_OUT).
_STEP_ITEMS = _items_from_specs(
    "s",
    spec="s.spec",
    payload="CASE WHEN s.run_id IS NULL THEN COALESCE(s.spec->'payload', 'null'::jsonb)\n"
    "            ELSE jsonb_build_object('run_id', s.run_id) END",
    item_id="s.item_id",
    step_id="s.id",
    attempts="s.default_max_attempts",
    trace="s.trace_context",
)
_CALLBACK_ITEM = _items_from_specs(
    f"(SELECT default_max_attempts, trace_context FROM {WORKFLOW} WHERE id = wf_id) AS w",
    spec="spec",
    payload="CASE WHEN jsonb_typeof(spec->'payload') = 'object' THEN spec->'payload' ELSE '{}'::jsonb END\n"
    "       || jsonb_build_object('workflow_id', wf_id, 'state', state)",
    item_id=f"nextval('{ITEM_SEQUENCE}')",
    step_id="NULL",
    attempts="w.default_max_attempts",
    trace="w.trace_context",
)
_FAN_OUT_ITEMS = _items_from_specs(
    "v CROSS JOIN spec",
    spec="spec.spec",
    payload="COALESCE(v.payload, 'null'::jsonb)",
    item_id="v.item_id",
    step_id="v.id",
    attempts="spec.default_max_attempts",
    trace="spec.trace_context",
)


# An event and an event wait (workflows/waits.py) are matched under a transaction-level advisory lock on their
# name and key, taken by the sender before its statement and by the wait's creation before it looks for a kept
# event: each then reads (in a statement after the lock, under a new snapshot) what the other committed, so an
# event is never stored unmatched while a wait for it is being created, nor the reverse. Several waits opening
# together take their locks in the order of the lock keys, so two such transactions never wait in a cycle.
EVENT_LOCK_KEY = "hashtextextended(concat_ws(chr(31), 'jobsite.wf_event', {name}, {key}), 0)"

# The oldest kept event of its name and key not claimed and not past its lookback, claimed by the wait (the
# event's unique step_id), ends it at once: its timeout item settles done with the event's payload, and the
# settle trigger ends the step (its result that payload) and moves the workflow on, as any settle does.
_CLAIM_KEPT_EVENT = f"""\
the oldest kept event with its name and key claims it.
FOR opened IN
    SELECT s.id, s.item_id, s.spec->>'event' AS event, s.spec->>'key' AS key,
           {EVENT_LOCK_KEY.format(name="s.spec->>'event'", key="s.spec->>'key'")} AS lock_key
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
        UPDATE {ITEM} SET state = 'done', result = kept, finished_at = now(), updated_at = now()
        WHERE id = opened.item_id AND state = 'ready';
    END IF;
END LOOP;
"""

# Enqueue the items of the steps named (those still waiting): a Spark step gets its SparkRun and the run's item on
# the spark queue, any other step an item of its task. Ids come from the tables' sequences first, so one statement
# writes runs, items and steps. Returns how many steps it enqueued. A step's ready_at is the clock, read under the
# workflow's row lock: later than every dependency's finished_at, so "ready after its dependencies finished" reads
# true on the rows, not only in commit order (the transaction may have started before the one that settled
# another dependency, then waited for the lock).
ENQUEUE_FUNCTION = f"""
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
        FROM queue_app_workflowstep st JOIN {WORKFLOW} w ON w.id = st.workflow_id
        WHERE st.id = ANY(ids) AND st.state = 'waiting'
        ORDER BY st.id
    ), runs AS (
        INSERT INTO queue_app_sparkrun (id, job, params, state, trigger, requested_by, item_id, attempt, app_id,
                                        ui_url, driver_host, progress, log_tail, error, timeout, queued_at)
        SELECT run_id, spec->>'job', spec->'params', 'queued', 'workflow', COALESCE(spec->>'requested_by', ''),
               item_id, 0, '', '', '', '{{}}'::jsonb, '', '', (spec->>'timeout')::float8, now()
        FROM s WHERE run_id IS NOT NULL
    ), items AS (
        {_at(8, _STEP_ITEMS)}
        RETURNING queue_id
    ), marked AS (
        UPDATE queue_app_workflowstep st
        SET state = 'queued', item_id = s.item_id, spark_run_id = s.run_id, ready_at = clock_timestamp()
        FROM s WHERE st.id = s.id
        RETURNING st.id
    )
    SELECT (SELECT count(*) FROM marked) INTO n
    FROM (SELECT count(pg_notify(channel, queue_id)::text) FROM (SELECT DISTINCT queue_id FROM items) AS q) AS woken;
    -- An event wait now open whose event came first: {_at(4, _CLAIM_KEPT_EVENT).rstrip()}
    RETURN n;
END
$$;
"""

# A workflow-level callback item (spec {"task", "queue", "max_attempts", "payload", ...}), not a step: its payload
# is the spec's (an object) with the workflow's id and state.
CALLBACK_FUNCTION = f"""
CREATE OR REPLACE FUNCTION queue_app_wf_callback(wf_id bigint, spec jsonb, state text, channel text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF spec IS NULL THEN
        RETURN;
    END IF;
    {_at(4, _CALLBACK_ITEM)};
    PERFORM pg_notify(channel, spec->>'queue');
END
$$;
"""

# No step of the current attempt is open any more: succeed; or, failed, run the compensations of the completed
# steps (once: then fail); or end a cancel.
FINISH_FUNCTION = """
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
"""

# A step that failed (with on_failure 'fail') or was cancelled: what waits for it can never run and is cancelled;
# unless the workflow is being cancelled anyway, the workflow fails: everything not started is cancelled (a queued
# step whose item is still ready, with its item and Spark run), running steps finish. The caller holds the
# workflow's row lock and has counted the step itself. The items are cancelled first and their steps after, by
# what that UPDATE returns: an item a worker leased meanwhile (its lock waited for, its state no longer 'ready'
# when re-read) is left to run, and its step with it, never a step marked cancelled whose item runs anyway.
STEP_FAILED_FUNCTION = """
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
"""

# Each step item that ended (the WHEN of the row trigger workflow_step_settled): remembered for the end of the
# statement, where queue_app_wf_statement_settled ends the steps of all of them in one go.
ITEM_SETTLED_FUNCTION = """
CREATE OR REPLACE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobsite.workflow_items_ended',
                       COALESCE(current_setting('jobsite.workflow_items_ended', true), '') || NEW.id::text || ',',
                       true);
    RETURN NULL;
END
$$;
"""

# Once per UPDATE statement on queue items: the steps of the step items it ended end the same way, in one UPDATE,
# each at most once (the step row's state is the claim); a Spark step's outcome and result are its run's (state
# and metrics). The UPDATE returns what moving their workflows forward needs (queue_app_wf_steps_ended). For a
# statement that ended no step item (every plain settle) this is one lookup of a transaction-local setting.
STATEMENT_SETTLED_FUNCTION = """
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
"""

# Conditions (docs/how-to/workflows.md, Conditions): of the steps whose dependencies all ended (`ready`, a
# settle's, or a repair's), those marked conditional in their spec ("run_if": the definition marks a step with a
# rule other than the default, or downstream of a branch or of another conditional step) are decided from
# their dependencies' states (ordering-only edges aside) and their rule; every other step runs. A step is skipped
# when every dependency was skipped, when a branch it depends on ended without choosing it (the branch's result
# names the chosen: a name, a list, or {"chosen": [...]}), or when its rule is not met: all_succeeded (the
# default) a skipped dependency, none_failed a failed one, any_failed none failed; all_done runs whatever ended
# (a dependency that failed with on_failure 'fail' or was cancelled cancels what waits for it before any rule is
# read, as always). A skipped step ends at once: its workflow's open count moves, and what waits for it is
# counted down and decided the same way, until nothing more is skipped. Returns the steps to enqueue. The caller
# holds the workflows' row locks; only the rules' names are read here, no user code.
DECIDE_FUNCTION = """
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

# The steps that just ended, as their ending UPDATE returned them: in one go per statement under each workflow's
# row lock (taken in id order, so two settling transactions never wait for each other in a cycle). Only the steps
# of each workflow's current attempt count (a late settle of an earlier attempt's step changes nothing more).
# Downstream steps' pending counts are lowered through their primary key (whatever the statistics say), those
# reaching 0 are enqueued, the workflows' counters move, failures cancel what can no longer run, and a workflow
# with no open step left ends.
STEPS_ENDED_FUNCTION = """
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
"""

# Steps and edges have no foreign key constraints (each was checked on every row at commit, and every such row is
# written under its workflow's row lock): a deleted workflow takes its steps and their edges (every edge joins two
# steps of one workflow) with it, as the constraints' cascade did, and frees its start key (WORKFLOW_CLAIM_KEY).
WORKFLOW_DELETED_FUNCTION = """
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

# An approval step that starts waiting (queue_app_wf_enqueue marked it queued, its timeout item written in the same
# statement) publishes the `workflow.approval_requested` webhook event in that transaction: when an enabled
# endpoint subscribes, one item of the webhooks' publish task (the step's spec "requested", its queue ensured at
# start) carrying the event, which that task's transactional handler fans out to the subscribers. No endpoint:
# nothing is written. A repair's new wait publishes again.
_APPROVAL_REQUESTED_ITEM = _items_from_specs(
    f"(SELECT default_max_attempts, trace_context FROM {WORKFLOW} WHERE id = NEW.workflow_id) AS w",
    spec="NEW.spec->'requested'",
    payload="jsonb_build_object('type', 'workflow.approval_requested', 'data', jsonb_build_object(\n"
    "           'workflow_id', NEW.workflow_id,\n"
    "           'workflow', (SELECT name FROM queue_app_workflow WHERE id = NEW.workflow_id),\n"
    "           'attempt', NEW.attempt, 'step', NEW.name, 'step_id', NEW.id, 'permission', NEW.spec->>'permission',\n"
    "           'timeout', NEW.args->'timeout', 'on_timeout', NEW.args->>'on_timeout',\n"
    "           'expires_at', CASE WHEN NEW.args->>'timeout' IS NOT NULL\n"
    f"                              THEN (SELECT run_at FROM {ITEM} WHERE id = NEW.item_id) END))",
    item_id=f"nextval('{ITEM_SEQUENCE}')",
    step_id="NULL",
    attempts="w.default_max_attempts",
    trace="w.trace_context",
)
APPROVAL_REQUESTED_FUNCTION = f"""
CREATE OR REPLACE FUNCTION queue_app_wf_approval_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.spec->'requested' IS NULL OR NOT EXISTS (
        SELECT 1 FROM queue_app_webhookendpoint WHERE enabled AND event_types ? 'workflow.approval_requested'
    ) THEN
        RETURN NULL;
    END IF;
    {_at(4, _APPROVAL_REQUESTED_ITEM)};
    PERFORM pg_notify(channel, NEW.spec->'requested'->>'queue') FROM {WORKFLOW} WHERE id = NEW.workflow_id;
    RETURN NULL;
END
$$;
"""

# A step with a deadline (spec "deadline": the item spec of queue_app.workflow_deadline with "delay" seconds or
# "until" a time, workflows/definition.py Graph.deadline) that becomes ready (queue_app_wf_enqueue marked it
# queued) arms it in that transaction: one delayed item naming the workflow, attempt and step, due that long
# after now (its start) or then. workflows/deadlines.py acts on it only if the step is still open by then.
_STEP_DEADLINE_ITEM = _items_from_specs(
    f"(SELECT default_max_attempts, trace_context FROM {WORKFLOW} WHERE id = NEW.workflow_id) AS w",
    spec="NEW.spec->'deadline'",
    payload="jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,\n"
    "                          'step', NEW.name)",
    item_id=f"nextval('{ITEM_SEQUENCE}')",
    step_id="NULL",
    attempts="w.default_max_attempts",
    trace="w.trace_context",
)
STEP_DEADLINE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION queue_app_wf_step_deadline() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {_at(4, _STEP_DEADLINE_ITEM)};
    RETURN NULL;
END
$$;
"""

# Sub-workflows (workflows/children.py). A sub-workflow step that becomes ready (queue_app_wf_enqueue marked it
# queued, its item written in the same statement: the wait, a delayed item never due) with no child linked yet
# (one its workflow's start transaction made is linked as the step's row is written) queues its start in that
# transaction: one item of queue_app.workflow_start_child (the step's spec "start", its queue ensured at start)
# naming the step, carrying the parent's trace context; its transactional handler starts (or finds, by the key)
# the child and links it to the step (child_workflow_id), in one transaction.


def _child_item_function(function: str, spec: str, payload: str = "") -> str:
    """A trigger function queueing the one built-in item of a sub-workflow step's `spec` ("start" or "cancel"),
    naming the step (and `payload`'s further pairs) and carrying the parent's trace context, then waking that
    item's queue."""
    item = _items_from_specs(
        f"(SELECT default_max_attempts, trace_context FROM {WORKFLOW} WHERE id = NEW.workflow_id) AS w",
        spec=f"NEW.spec->'{spec}'",
        payload="jsonb_build_object('workflow_id', NEW.workflow_id, 'attempt', NEW.attempt, 'step_id', NEW.id,\n"
        f"                          'step', NEW.name{payload})",
        item_id=f"nextval('{ITEM_SEQUENCE}')",
        step_id="NULL",
        attempts="w.default_max_attempts",
        trace="w.trace_context",
    )
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {_at(4, item)};
    PERFORM pg_notify(channel, NEW.spec->'{spec}'->>'queue') FROM {WORKFLOW} WHERE id = NEW.workflow_id;
    RETURN NULL;
END
$$;
"""


# The start item carries the child's definition name, parameters and declared key (the step's spec, which never
# changes): its handler builds the child's graph before its first statement (child_steps.start_child).
CHILD_START_FUNCTION = _child_item_function(
    "queue_app_wf_child_start",
    "start",
    ",\n                          'workflow', NEW.spec->'workflow', 'params', NEW.spec->'params',"
    " 'key', NEW.spec->'key'",
)

# A sub-workflow step cancelled while it waited (the parent cancelled, failed at another step, or past a deadline)
# queues its child's cancel in that transaction: one item of queue_app.workflow_cancel_child (spec "cancel")
# naming the step; its handler cancels the child (services.cancel) unless another open step waits for it. Not
# the child's row here: its end takes its own row's lock, then the parent's step item's and the parent's row's,
# and a cancel holding the parent's would take them in the other order.
CHILD_CANCEL_FUNCTION = _child_item_function("queue_app_wf_child_cancel", "cancel")

# A child workflow that ended settles the item (the wait) of every open sub-workflow step naming it, still ready
# (locked: its parent's cancel or failure, which cancels it, and this take turns): done with the child's result
# when it succeeded, dead (no dead letter: nothing failed to run) with why when it failed or was cancelled. The
# settle trigger then ends the step, and moves the parent on, as for any step (its failure policy and
# compensations included). Run by the trigger workflow_child_ended in the transaction that ends the child, and by
# a start that finds its child already ended. The result: {"workflow_id", "state", "results"}, the last steps'
# results (those no step depends on) by name. Returns how many steps it ended.
CHILD_SETTLE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION queue_app_wf_child_settle(child_id bigint) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    c {WORKFLOW}%ROWTYPE;
    n integer;
BEGIN
    SELECT * INTO c FROM {WORKFLOW} WHERE id = child_id;
    IF c.state NOT IN ('succeeded', 'failed', 'cancelled') THEN
        RETURN 0;
    END IF;
    UPDATE {ITEM} i
    SET state = CASE WHEN c.state = 'succeeded' THEN 'done' ELSE 'dead' END,
        result = jsonb_build_object('workflow_id', c.id, 'state', c.state, 'results', COALESCE((
            SELECT jsonb_object_agg(s.name, s.result) FROM queue_app_workflowstep s
            WHERE s.workflow_id = c.id AND s.attempt = c.attempt AND s.state = 'succeeded' AND s.kind <> 'compensation'
              AND NOT EXISTS (SELECT FROM queue_app_stepdependency d WHERE d.upstream_id = s.id AND NOT d.order_only)
        ), '{{}}'::jsonb)),
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
"""
CHILD_ENDED_FUNCTION = """
CREATE OR REPLACE FUNCTION queue_app_wf_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queue_app_wf_child_settle(NEW.id);
    RETURN NULL;
END
$$;
"""

TRIGGERS = """
CREATE OR REPLACE TRIGGER workflow_step_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
    WHEN (NEW.workflow_step_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION queue_app_wf_item_settled();
CREATE OR REPLACE TRIGGER workflow_steps_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH STATEMENT
    EXECUTE FUNCTION queue_app_wf_statement_settled();
CREATE OR REPLACE TRIGGER workflow_deleted AFTER DELETE ON queue_app_workflow REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION queue_app_workflow_deleted();
CREATE OR REPLACE TRIGGER workflow_approval_requested AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'approval' AND NEW.state = 'queued' AND OLD.state = 'waiting')
    EXECUTE FUNCTION queue_app_wf_approval_requested();
CREATE OR REPLACE TRIGGER workflow_step_deadline AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.state = 'queued' AND OLD.state = 'waiting' AND NEW.spec ? 'deadline')
    EXECUTE FUNCTION queue_app_wf_step_deadline();
CREATE OR REPLACE TRIGGER workflow_child_start AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'workflow' AND NEW.state = 'queued' AND OLD.state = 'waiting'
          AND NEW.child_workflow_id IS NULL)
    EXECUTE FUNCTION queue_app_wf_child_start();
CREATE OR REPLACE TRIGGER workflow_child_cancel AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'workflow' AND NEW.state = 'cancelled' AND OLD.state = 'queued')
    EXECUTE FUNCTION queue_app_wf_child_cancel();
CREATE OR REPLACE TRIGGER workflow_child_ended AFTER UPDATE OF state ON queue_app_workflow FOR EACH ROW
    WHEN (NEW.state IN ('succeeded', 'failed', 'cancelled') AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION queue_app_wf_child_ended();
"""

FUNCTIONS = (
    ENQUEUE_FUNCTION,
    CALLBACK_FUNCTION,
    FINISH_FUNCTION,
    STEP_FAILED_FUNCTION,
    ITEM_SETTLED_FUNCTION,
    STATEMENT_SETTLED_FUNCTION,
    STEPS_ENDED_FUNCTION,
    DECIDE_FUNCTION,
    WORKFLOW_DELETED_FUNCTION,
    APPROVAL_REQUESTED_FUNCTION,
    STEP_DEADLINE_FUNCTION,
    CHILD_START_FUNCTION,
    CHILD_CANCEL_FUNCTION,
    CHILD_SETTLE_FUNCTION,
    CHILD_ENDED_FUNCTION,
)
# Every function and trigger as they are now, idempotent (CREATE OR REPLACE): what a migration's frozen copy is
# taken from, and what the source test installs to compare with a migrated database.
INSTALL = "".join(FUNCTIONS) + TRIGGERS

# -- the statements the services run ------------------------------------------------------------------------------

# Start and repair enqueue the steps with nothing to wait for; cancel and repair end a workflow with nothing left
# to run. Everything else happens inside the settling statement, through the triggers above.
WORKFLOW_ENQUEUE = "SELECT queue_app_wf_enqueue(%(ids)s::bigint[], %(channel)s)"
WORKFLOW_FINISH = "SELECT queue_app_wf_finish(%(workflow_id)s)"
# A sub-workflow step's start found its child already ended: settle the step's wait now (workflows/children.py).
WORKFLOW_CHILD_SETTLE = "SELECT queue_app_wf_child_settle(%(child_id)s)"
# The same for the children a workflow's start made and linked (services._start_children).
WORKFLOW_CHILDREN_SETTLE = "SELECT queue_app_wf_child_settle(c) FROM unnest(%(ids)s::bigint[]) AS c"
# A repair's steps with nothing left to wait for: conditional ones are decided first (a branch kept from the
# earlier attempt still skips the steps it did not choose); the caller then ends the workflow (WORKFLOW_FINISH)
# if nothing is left open.
WORKFLOW_DECIDE_AND_ENQUEUE = "SELECT queue_app_wf_enqueue(queue_app_wf_decide(%(ids)s::bigint[]), %(channel)s)"

# A running step adds steps (one per partition it found), each written once, already queued: its row, its item
# (ready at once) and its edges to every step waiting for the parent (which now waits for the new ones too), in
# one statement with ids drawn from the sequences first, and one NOTIFY. Measured in queue_bench's workflow part:
# writing the steps waiting, then enqueueing them (an UPDATE of every step row, each a non-HOT update of six
# indexes) cost about twice as much. Names already added (the parent ran again after a crash) are left alone.
# The caller holds the workflow's row lock (so no other transaction adds names to it meanwhile).
WORKFLOW_FAN_OUT = f"""
WITH v AS MATERIALIZED (
    SELECT v.name, v.payload, nextval('{STEP_SEQUENCE}') AS id, nextval('{ITEM_SEQUENCE}') AS item_id
    FROM unnest(%(names)s::text[], %(payloads)s::jsonb[]) AS v(name, payload)
    WHERE NOT EXISTS (SELECT FROM queue_app_workflowstep s
                      WHERE s.workflow_id = %(workflow_id)s AND s.attempt = %(attempt)s AND s.name = v.name)
), spec AS (
    SELECT %(spec)s::jsonb AS spec, w.default_max_attempts,
           COALESCE(%(trace_context)s, w.trace_context) AS trace_context
    FROM {WORKFLOW} w WHERE w.id = %(workflow_id)s
), new AS (
    INSERT INTO queue_app_workflowstep (id, workflow_id, attempt, name, "group", kind, target, args, spec,
                                        on_failure, compensate, parent_id, kept, state, pending, item_id, error,
                                        created_at, ready_at)
    SELECT v.id, %(workflow_id)s, %(attempt)s, v.name, %(group)s, 'task', %(task)s, v.payload,
           jsonb_set(spec.spec, '{{payload}}', v.payload), %(on_failure)s, %(compensate)s::jsonb, %(parent_id)s,
           false, 'queued', 0, v.item_id, '', now(), now()
    FROM v, spec
), items AS (
    {_at(4, _FAN_OUT_ITEMS)}
), edges AS (
    INSERT INTO queue_app_stepdependency (upstream_id, downstream_id)
    SELECT v.id, d.downstream_id FROM v, queue_app_stepdependency d WHERE d.upstream_id = %(parent_id)s
    RETURNING downstream_id
), bumped AS (
    UPDATE queue_app_workflowstep s SET pending = s.pending + c.n
    FROM (SELECT downstream_id, count(*) AS n FROM edges GROUP BY downstream_id) c
    WHERE s.id = c.downstream_id
), counted AS (
    UPDATE queue_app_workflow SET steps_open = steps_open + (SELECT count(*) FROM v),
        steps_total = steps_total + (SELECT count(*) FROM v)
    WHERE id = %(workflow_id)s
)
SELECT coalesce(array_agg(id ORDER BY id), '{{}}'),
       (SELECT count(pg_notify(%(channel)s, spec.spec->>'queue')) FROM spec WHERE EXISTS (SELECT FROM v))
FROM v
"""

# The claim of a start's idempotency key (models.WorkflowStartKey), before the workflow is written: the key row
# names the id the workflow will have (drawn from its sequence here). A key whose window (if any) has not passed
# is left alone and nothing is returned: the caller reads whose it is (a deleted workflow's key went with it,
# queue_app_workflow_deleted). A concurrent starter with the same key waits here for the first one's transaction;
# once that commits, the conflict leaves the key with it, once it rolls back the second one inserts. The WHERE
# reads only the key row: the conflicting row is read as committed, any other table as of the statement's start.
_CLAIM_KEY = """
INSERT INTO queue_app_workflowstartkey AS k (name, key, workflow_id, created_at, expires_at)
{source}
ON CONFLICT (name, key) DO UPDATE
SET workflow_id = EXCLUDED.workflow_id, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= now()
RETURNING workflow_id"""
_NEW_WORKFLOW_ID = f"nextval(pg_get_serial_sequence('{WORKFLOW}', 'id'))"
WORKFLOW_CLAIM_KEY = _CLAIM_KEY.format(
    source=f"VALUES (%(name)s, %(key)s, {_NEW_WORKFLOW_ID}, now(),\n"
    "        now() + make_interval(secs => %(window)s::float8))"
)
WORKFLOW_KEY_HOLDER = "SELECT workflow_id FROM queue_app_workflowstartkey WHERE name = %(name)s AND key = %(key)s"

# A sub-workflow step's start item (workflows/child_steps.py, start_child), in one statement what it read in
# five or more: the step (its spec, state and attempt), its key (children.child_key's rule: the declared one,
# else "parent <workflow id>/<step name>", 200 characters at most), the workflow its key names (the holder), its
# workflow's current attempt, and how many ancestors that workflow has (counted up to %(limit)s, each level the
# latest sub-workflow step naming it, as children.parent_of reads it). The step's row is locked here only when
# no workflow holds its key: one that does is locked first, then the step (the lock order, children.py). It
# also makes the queues of the child's items (%(queues)s, engine sql.ENSURE_QUEUE's row; empty when the item
# did not carry the child's definition to build it from first), which its start then does not, and, with
# %(claim)s (the child's graph was built), claims the key for a new workflow id when the step is current, no
# workflow holds the key and the child is not too deep (the claim's id last; NULL: not claimed). Run in a
# savepoint: a start that fails after it undoes the claim.
_CHILD_CLAIM = f"""SELECT s.spec->>'workflow', s.key, {_NEW_WORKFLOW_ID}, now(), NULL
FROM s, locked, depth
WHERE %(claim)s AND locked.state = 'queued' AND depth.depth < %(limit)s - 1
  AND locked.attempt = (SELECT attempt FROM {WORKFLOW} WHERE id = s.workflow_id)"""
WORKFLOW_CHILD_START_READ = f"""
WITH RECURSIVE ensured AS (
    INSERT INTO {QUEUE} (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
    SELECT q, false, NULL, %(queue_lease_timeout)s, %(queue_max_attempts)s, %(queue_retention)s, now()
    FROM unnest(%(queues)s::text[]) AS q
    ON CONFLICT (name) DO NOTHING
), s AS (
    SELECT id, workflow_id, name, spec, item_id,
           COALESCE(NULLIF(spec->>'key', ''), left('parent ' || workflow_id || '/' || name, 200)) AS key
    FROM queue_app_workflowstep WHERE id = %(step_id)s AND kind = 'workflow'
), holder AS (
    SELECT k.workflow_id FROM queue_app_workflowstartkey k JOIN s ON k.name = s.spec->>'workflow' AND k.key = s.key
), locked AS (
    SELECT l.state, l.attempt FROM queue_app_workflowstep l
    WHERE l.id = %(step_id)s AND NOT EXISTS (SELECT FROM holder)
    FOR UPDATE
), up(id, depth) AS (
    SELECT workflow_id, 0 FROM s
    UNION ALL
    SELECT (SELECT p.workflow_id FROM queue_app_workflowstep p
            WHERE p.child_workflow_id = up.id AND p.kind = 'workflow' ORDER BY p.id DESC LIMIT 1), up.depth + 1
    FROM up WHERE up.id IS NOT NULL AND up.depth < %(limit)s
), depth AS (
    SELECT max(depth) AS depth FROM up WHERE id IS NOT NULL
), claim AS (
    {_at(4, _CLAIM_KEY.format(source=_CHILD_CLAIM))}
)
SELECT s.workflow_id, s.name, s.spec, s.item_id, s.key, (SELECT workflow_id FROM holder), locked.state,
       locked.attempt, (SELECT attempt FROM {WORKFLOW} WHERE id = s.workflow_id), (SELECT depth FROM depth),
       (SELECT workflow_id FROM claim)
FROM s LEFT JOIN locked ON true
"""

# An event sent (workflows/waits.py, send_event), after WORKFLOW_EVENT_LOCK: stored, and matched in the same
# statement to the oldest event wait open for its name and key whose timeout item is still ready (locked: a
# worker leasing it now skips it, or has leased it and the wait is timing out). That item settles done with the
# payload: the settle trigger ends the step with it as its result. Returns the event's id, the step it woke (or
# NULL: kept for the lookback) and that step's workflow.
WORKFLOW_SEND_EVENT = f"""
WITH target AS (
    SELECT s.id AS step_id, s.workflow_id, s.item_id
    FROM queue_app_workflowstep s JOIN {ITEM} i ON i.id = s.item_id
    WHERE s.kind = 'event' AND s.state = 'queued' AND s.spec->>'event' = %(name)s AND s.spec->>'key' = %(key)s
      AND i.state = 'ready'
    ORDER BY s.id LIMIT 1
    FOR UPDATE OF i
), ev AS (
    INSERT INTO queue_app_workflowevent (name, key, payload, created_at, expires_at, step_id, claimed_at)
    SELECT %(name)s, %(key)s, %(payload)s::jsonb, now(), now() + make_interval(secs => %(lookback)s::float8),
           t.step_id, CASE WHEN t.step_id IS NOT NULL THEN now() END
    FROM (SELECT) AS one LEFT JOIN target t ON true
    RETURNING id, step_id
), woken AS (
    UPDATE {ITEM} i SET state = 'done', result = %(payload)s::jsonb, finished_at = now(), updated_at = now()
    FROM target t WHERE i.id = t.item_id AND i.state = 'ready'
    RETURNING i.id
)
SELECT ev.id, ev.step_id, (SELECT t.workflow_id FROM target t), (SELECT count(*) FROM woken) FROM ev
"""
WORKFLOW_EVENT_LOCK = (
    f"SELECT pg_advisory_xact_lock({EVENT_LOCK_KEY.format(name='%(name)s::text', key='%(key)s::text')})"
)

# A batch of events sent at once (workflows/waits.py, send_events), after WORKFLOW_EVENTS_LOCK: one statement
# stores them all and matches them the way WORKFLOW_SEND_EVENT matches one: per name and key, the batch's events
# in their order end the waits open for it (timeout item still ready, locked), oldest first, one each; the rest
# are kept for the lookback. The insert takes the events in batch order, so its ids ascend in it. Returns the
# events' ids, the steps they ended (NULL: kept) and those steps' workflows, each an array in batch order.
WORKFLOW_SEND_EVENTS = f"""
WITH sent AS MATERIALIZED (
    SELECT u.ord, u.name, u.key, u.payload::jsonb AS payload,
           row_number() OVER (PARTITION BY u.name, u.key ORDER BY u.ord) AS rn
    FROM unnest(%(names)s::text[], %(keys)s::text[], %(payloads)s::text[]) WITH ORDINALITY AS u(name, key, payload, ord)
), open_waits AS MATERIALIZED (
    SELECT s.id AS step_id, s.workflow_id, s.item_id, k.name, k.key
    FROM (SELECT DISTINCT name, key FROM sent) AS k
    CROSS JOIN LATERAL (
        SELECT o.id, o.workflow_id, o.item_id FROM queue_app_workflowstep o
        WHERE o.kind = 'event' AND o.state = 'queued' AND o.spec->>'event' = k.name AND o.spec->>'key' = k.key
    ) AS s
    JOIN {ITEM} i ON i.id = s.item_id
    WHERE i.state = 'ready'
    ORDER BY s.id
    FOR UPDATE OF i
), waits AS (
    SELECT *, row_number() OVER (PARTITION BY name, key ORDER BY step_id) AS rn FROM open_waits
), matched AS (
    SELECT sent.ord, sent.name, sent.key, sent.payload, w.step_id, w.workflow_id, w.item_id
    FROM sent LEFT JOIN waits w ON w.name = sent.name AND w.key = sent.key AND w.rn = sent.rn
), ev AS (
    INSERT INTO queue_app_workflowevent (name, key, payload, created_at, expires_at, step_id, claimed_at)
    SELECT name, key, payload, now(), now() + make_interval(secs => %(lookback)s::float8), step_id,
           CASE WHEN step_id IS NOT NULL THEN now() END
    FROM matched ORDER BY ord
    RETURNING id
), woken AS (
    UPDATE {ITEM} i SET state = 'done', result = m.payload, finished_at = now(), updated_at = now()
    FROM matched m WHERE i.id = m.item_id AND i.state = 'ready'
    RETURNING i.id
)
SELECT (SELECT array_agg(id ORDER BY id) FROM ev), array_agg(step_id ORDER BY ord), array_agg(workflow_id ORDER BY ord),
       (SELECT count(*) FROM woken)
FROM matched
"""
# The advisory locks of a batch's names and keys, in one order (two batches sharing keys do not deadlock).
WORKFLOW_EVENTS_LOCK = f"""
SELECT count(pg_advisory_xact_lock(k)) FROM (
    SELECT DISTINCT {EVENT_LOCK_KEY.format(name="u.name", key="u.key")} AS k
    FROM unnest(%(names)s::text[], %(keys)s::text[]) AS u(name, key) ORDER BY k
) AS locks
"""

# Events no wait claimed by the end of their lookback are dropped (workflows/waits.py, drop_expired_events; the
# worker's drop_events unit), a batch at a time: a wait no longer claims them (its claim reads expires_at > now()),
# and a claimed event is kept with its step. Returns how many were dropped.
WORKFLOW_DROP_EXPIRED_EVENTS = """
WITH gone AS (
    DELETE FROM queue_app_workflowevent WHERE id IN (
        SELECT id FROM queue_app_workflowevent WHERE step_id IS NULL AND expires_at <= now()
        ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM gone
"""

# A decision on an approval (workflows/approvals.py, decide): its timeout item, still ready (locked: a worker
# leasing it now skips it; one that leased it first has the timeout win and this changes nothing), settles done
# (approved) or dead (rejected, no dead letter: nothing failed to run) with the decision as its result; the
# settle trigger ends the step succeeded or failed and moves the workflow on (a failure per its policy,
# compensations included), as any settle does. Only the current attempt's open step qualifies. Returns the
# workflow's id, or nothing when the step was not waiting for a decision.
WORKFLOW_DECIDE_APPROVAL = f"""
UPDATE {ITEM} i
SET state = CASE WHEN %(approve)s THEN 'done' ELSE 'dead' END, result = %(result)s::jsonb,
    error = %(error)s, finished_at = now(), updated_at = now()
FROM queue_app_workflowstep s JOIN {WORKFLOW} w ON w.id = s.workflow_id AND w.attempt = s.attempt
WHERE s.id = %(step_id)s AND s.kind = 'approval' AND s.state = 'queued' AND i.id = s.item_id AND i.state = 'ready'
RETURNING s.workflow_id
"""
