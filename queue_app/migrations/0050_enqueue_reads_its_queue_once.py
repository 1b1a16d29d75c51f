"""The plain enqueue reads its queue row once (sql._ENQUEUE): one probe of the primary key, locked FOR KEY SHARE,
for the queue's max_attempts and grouping both, and the queue created only when that read found no row, instead of
ENSURE_QUEUE's upsert (a speculative insertion into every existing queue) and two subqueries. The same outcomes,
a queue deleted under the enqueue included (tests/core/in_process/test_engine_queue_integrity.py). Issue 47: see
docs/benchmarks.md.

The SQL API's jobsite_enqueue runs that statement (engine/sql_api.py), so it is installed again: ENQUEUE_FUNCTION is
a frozen copy of the module's, and the reverse restores 0038's (tests/core/in_process/test_sql_api_source.py
compares the migrated functions with the module's). The signature is 0038's: CREATE OR REPLACE replaces it.
"""

from importlib import import_module

from django.db import migrations

ENQUEUE_FUNCTION = r"""
CREATE OR REPLACE FUNCTION jobsite_enqueue(
    task text, payload jsonb DEFAULT '{}', queue text DEFAULT NULL, priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, delay double precision DEFAULT NULL, dedup_key text DEFAULT NULL,
    dedup_window double precision DEFAULT NULL, ordering_key text DEFAULT NULL, group_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, lease_timeout double precision DEFAULT NULL, debounce_key text DEFAULT NULL,
    debounce double precision DEFAULT NULL, debounce_max double precision DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s queue_app_sqlsettings%ROWTYPE;
    declared queue_app_sqltask%ROWTYPE;
    v_task text := jobsite_enqueue.task;
    v_payload jsonb := COALESCE(jobsite_enqueue.payload, '{}');
    v_queue text := jobsite_enqueue.queue;
    v_priority integer := COALESCE(jobsite_enqueue.priority, 0);
    v_run_at timestamptz := jobsite_enqueue.run_at;
    v_delay double precision := COALESCE(jobsite_enqueue.delay, 0);
    v_dedup_key text := jobsite_enqueue.dedup_key;
    v_dedup_window double precision := jobsite_enqueue.dedup_window;
    v_ordering_key text := jobsite_enqueue.ordering_key;
    v_group_key text := jobsite_enqueue.group_key;
    v_max_attempts integer := jobsite_enqueue.max_attempts;
    v_lease_timeout double precision := jobsite_enqueue.lease_timeout;
    v_debounce_key text := jobsite_enqueue.debounce_key;
    v_debounce double precision := jobsite_enqueue.debounce;
    v_debounce_max double precision := jobsite_enqueue.debounce_max;
    v_absorbed integer;
    v_channel text;
    v_queue_lease_timeout double precision;
    v_queue_max_attempts integer;
    v_queue_retention interval;
    v_id bigint;
    v_when timestamptz;
    v_created timestamptz;
    v_notified text;
BEGIN
    SELECT * INTO s FROM queue_app_sqlsettings;
    IF v_task IS NULL OR v_task = '' OR length(v_task) > 200 THEN
        RAISE EXCEPTION 'task must be a non-empty name of at most 200 characters, not %', quote_nullable(v_task)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO declared FROM queue_app_sqltask WHERE name = v_task;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown task: %', v_task USING ERRCODE = 'invalid_parameter_value',
            HINT = 'jobsite_enqueue takes tasks declared with @job, published by manage.py migrate';
    END IF;
    IF declared.at_most_once AND v_max_attempts IS DISTINCT FROM 1 AND v_max_attempts IS NOT NULL THEN
        RAISE EXCEPTION '% is an at-most-once task, never retried: max_attempts=% contradicts it',
            v_task, v_max_attempts USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_queue := COALESCE(v_queue, declared.queue, s.default_queue);
    v_max_attempts := COALESCE(v_max_attempts, declared.max_attempts);
    IF v_queue !~ '^[A-Za-z0-9_.:\-]{1,100}$' THEN
        RAISE EXCEPTION 'queue name must match ^[A-Za-z0-9_.:\-]{1,100}$, not %', quote_literal(v_queue) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'priority must be an integer from -100 to 100, not %', v_priority USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_run_at IS NOT NULL AND jobsite_enqueue.delay IS NOT NULL THEN
        RAISE EXCEPTION 'give run_at or delay, not both' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_run_at IN ('infinity', '-infinity') THEN
        RAISE EXCEPTION 'run_at must be a finite time, not %', v_run_at USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_delay < 0 OR v_delay IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'delay must be a finite number >= 0, not %', v_delay USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be an integer >= 1, not %', v_max_attempts USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_lease_timeout < 0.001 OR v_lease_timeout IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'lease_timeout must be a finite number >= 0.001, not %', v_lease_timeout USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_ordering_key = '' OR length(v_ordering_key) > 200 OR v_group_key = '' OR length(v_group_key) > 200
       OR v_dedup_key = '' OR length(v_dedup_key) > 200 OR v_debounce_key = '' OR length(v_debounce_key) > 200 THEN
        RAISE EXCEPTION 'ordering_key, group_key, dedup_key and debounce_key must be non-empty strings of at most 200 '
            'characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_debounce_key IS NOT NULL OR v_debounce IS NOT NULL OR v_debounce_max IS NOT NULL THEN
        IF v_dedup_key IS NOT NULL THEN
            RAISE EXCEPTION 'give dedup_key (keep the first) or debounce_key (keep the latest), not both' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_debounce_key IS NULL OR v_debounce IS NULL THEN
            RAISE EXCEPTION 'a debounced enqueue takes both debounce_key and debounce (seconds)' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_debounce < 0.001 OR v_debounce IN ('NaN', 'Infinity') THEN
            RAISE EXCEPTION 'debounce must be a finite number >= 0.001, not %', v_debounce USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_debounce_max < v_debounce OR v_debounce_max IN ('NaN', 'Infinity') THEN
            RAISE EXCEPTION 'debounce_max (% s) must be a finite number of at least debounce (% s)', v_debounce_max,
                v_debounce USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_run_at IS NOT NULL OR v_delay <> 0 THEN
            RAISE EXCEPTION 'a debounced item is due when its key goes quiet: give debounce, not run_at or delay'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF octet_length(v_payload::text) > s.max_payload_bytes THEN
        RAISE EXCEPTION 'payload is % bytes, over the limit of %', octet_length(v_payload::text),
            s.max_payload_bytes USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_path_exists(v_payload, ('strict $.**{' || s.max_payload_depth || '}')::jsonpath) THEN
        RAISE EXCEPTION 'payload nested deeper than % levels', s.max_payload_depth USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_channel := s.notify_channel;
    v_queue_lease_timeout := s.default_lease_timeout;
    v_queue_max_attempts := s.default_max_attempts;
    v_queue_retention := make_interval(days => s.default_retention_days);
    IF v_debounce_key IS NOT NULL THEN
        WITH q AS (
INSERT INTO queue_app_queue (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
VALUES (v_queue, false, NULL, v_queue_lease_timeout, v_queue_max_attempts, v_queue_retention, now())
ON CONFLICT (name) DO NOTHING
), up AS (
    INSERT INTO queue_app_queueitem AS i (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts,
    lease_timeout, dedup_key, ordering_key, group_key, error, created_at, updated_at, debounce_key, debounce_until)
    VALUES (DEFAULT, v_queue, v_task, v_payload::jsonb, 'ready', v_priority, LEAST(now() + make_interval(secs => v_debounce),
           now() + make_interval(secs => v_debounce_max)),
            LEAST(now() + make_interval(secs => v_debounce),
           now() + make_interval(secs => v_debounce_max)), 0, COALESCE(v_max_attempts, (SELECT max_attempts FROM queue_app_queue WHERE name = v_queue),
    v_queue_max_attempts), v_lease_timeout, NULL, v_ordering_key, COALESCE(v_group_key,
    (SELECT CASE WHEN (fair OR group_concurrency IS NOT NULL) THEN '' END FROM queue_app_queue WHERE name = v_queue FOR KEY SHARE)), '',
            now(), now(), v_debounce_key, now() + make_interval(secs => v_debounce_max))
    ON CONFLICT (queue_id, debounce_key) WHERE state = 'ready' AND debounce_key IS NOT NULL AND reservation_id IS NULL
    DO UPDATE SET payload = EXCLUDED.payload, absorbed = i.absorbed + 1, updated_at = now(),
        run_at = LEAST(now() + make_interval(secs => v_debounce), i.debounce_until),
        visible_at = LEAST(now() + make_interval(secs => v_debounce), i.debounce_until)
    WHERE i.task = EXCLUDED.task
    RETURNING i.id, i.run_at, i.created_at, i.absorbed
)
SELECT id, run_at, created_at, absorbed, CASE WHEN absorbed = 0 THEN pg_notify(v_channel, v_queue)::text END
FROM up
        INTO v_id, v_when, v_created, v_absorbed, v_notified;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'debounce key % is held by a ready item of another task in queue %',
                quote_literal(v_debounce_key), quote_literal(v_queue) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN v_id;  -- a new item of the key, or its ready item now carrying this payload
    END IF;
    IF v_dedup_key IS NULL THEN
        WITH qr AS (
    SELECT max_attempts, CASE WHEN (fair OR group_concurrency IS NOT NULL) THEN '' END AS group_default FROM queue_app_queue
    WHERE name = v_queue FOR KEY SHARE
), q AS (
    INSERT INTO queue_app_queue (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
    SELECT v_queue, false, NULL, v_queue_lease_timeout, v_queue_max_attempts, v_queue_retention, now()
    WHERE NOT EXISTS (SELECT FROM qr)
    ON CONFLICT (name) DO NOTHING
), ins AS (
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts,
    lease_timeout, dedup_key, ordering_key, group_key, error, created_at, updated_at)
    VALUES (DEFAULT, v_queue, v_task, v_payload::jsonb, 'ready', v_priority, COALESCE(v_run_at::timestamptz, now() + make_interval(secs => v_delay)), COALESCE(v_run_at::timestamptz, now() + make_interval(secs => v_delay)), 0,
            COALESCE(v_max_attempts, (SELECT max_attempts FROM qr), v_queue_max_attempts), v_lease_timeout,
            NULL, v_ordering_key, COALESCE(v_group_key, (SELECT group_default FROM qr)), '', now(),
            now())
    RETURNING id, run_at, created_at
)
SELECT id, run_at, created_at, pg_notify(v_channel, v_queue)::text FROM ins
        INTO v_id, v_when, v_created, v_notified;
        RETURN v_id;
    END IF;
    v_dedup_window := COALESCE(v_dedup_window, declared.dedup_window, s.dedup_window);
    IF v_dedup_window < 0.001 OR v_dedup_window IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'dedup_window must be a finite number >= 0.001, not %', v_dedup_window USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOOP
        WITH q AS (
INSERT INTO queue_app_queue (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
VALUES (v_queue, false, NULL, v_queue_lease_timeout, v_queue_max_attempts, v_queue_retention, now())
ON CONFLICT (name) DO NOTHING
), claim AS (
    INSERT INTO queue_app_dedupclaim AS c (queue_id, key, item_id, expires_at)
    VALUES (v_queue, v_dedup_key, nextval(pg_get_serial_sequence('queue_app_queueitem', 'id')),
            now() + make_interval(secs => v_dedup_window))
    ON CONFLICT (queue_id, key) DO UPDATE
        SET item_id = EXCLUDED.item_id, expires_at = EXCLUDED.expires_at
        WHERE c.expires_at <= now()
    RETURNING item_id
), ins AS (
    INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts,
    lease_timeout, dedup_key, ordering_key, group_key, error, created_at, updated_at)
    SELECT claim.item_id, v_queue, v_task, v_payload::jsonb, 'ready', v_priority, COALESCE(v_run_at::timestamptz, now() + make_interval(secs => v_delay)), COALESCE(v_run_at::timestamptz, now() + make_interval(secs => v_delay)), 0,
           COALESCE(v_max_attempts, (SELECT max_attempts FROM queue_app_queue WHERE name = v_queue),
    v_queue_max_attempts), v_lease_timeout, v_dedup_key, v_ordering_key, COALESCE(v_group_key,
    (SELECT CASE WHEN (fair OR group_concurrency IS NOT NULL) THEN '' END FROM queue_app_queue WHERE name = v_queue FOR KEY SHARE)), '', now(),
           now()
    FROM claim
    RETURNING id, run_at, created_at
)
SELECT id, run_at, created_at, pg_notify(v_channel, v_queue)::text FROM ins
        INTO v_id, v_when, v_created, v_notified;
        IF FOUND THEN
            RETURN v_id;
        END IF;
        SELECT c.item_id, i.run_at, i.created_at FROM queue_app_dedupclaim c
LEFT JOIN LATERAL (  -- the owner may have finished and been archived inside the window
    SELECT run_at, created_at FROM queue_app_queueitem WHERE id = c.item_id
    UNION ALL
    SELECT run_at, created_at FROM queue_app_itemhistory WHERE id = c.item_id
    LIMIT 1
) i ON true
WHERE c.queue_id = v_queue AND c.key = v_dedup_key
        INTO v_id, v_when, v_created;
        IF FOUND THEN
            RETURN v_id;  -- a duplicate inside the window: the first item
        END IF;
        -- The claim vanished between the two statements (its window ended and it was pruned): claim again.
    END LOOP;
END
$$;
"""


_function = import_module("queue_app.migrations.0049_ordering_key_free_function")._function

# The reverse: the function as migration 0038 installed it.
ENQUEUE_FUNCTION_0038 = _function(
    import_module("queue_app.migrations.0038_sql_enqueue_debounce").INSTALL, "jobsite_enqueue"
)


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0049_ordering_key_free_function")]

    operations = [migrations.RunSQL(ENQUEUE_FUNCTION, reverse_sql=ENQUEUE_FUNCTION_0038)]
