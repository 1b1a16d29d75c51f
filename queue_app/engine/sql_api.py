"""The SQL API (issue 41): jobsite_enqueue, jobsite_lease, jobsite_complete and jobsite_fail, for producers and
consumers that are not Django (another language, a trigger, a psql script), inside their own transactions.

One source: each function's data-changing statement IS the engine's own (sql.ENQUEUE, sql.ENQUEUE_DEDUP,
sql.DEDUP_OWNER, sql.ENQUEUE_DEBOUNCE, sql.LEASE, sql.COMPLETE_MANY, sql.FAIL) with its %(name)s parameters bound
to PL/pgSQL variables here, so the item INSERT, the dedup claim, the debounce upsert, the lease and the fenced
settles are written once. The migrations that install them hold frozen copies (0025, and jobsite_enqueue's with
debounce in 0038); tests/core/in_process/test_sql_api_source.py compares the migrated functions with INSTALL.

Task defaults (queue, attempts, dedup window, at-most-once) live in Python, in the @job declarations
(registry.item_defaults). The database cannot read them there, so they are published into TASKS (publish(),
called after `migrate` and by registry.publish_declarations) and jobsite's settings into SETTINGS: the SQL
function applies what Python would, and refuses a task no process has declared.
"""

from collections.abc import Mapping
from typing import Any

from ..conf import queue_settings
from . import sql
from .db import cursor

TASKS = "queue_app_sqltask"
SETTINGS = "queue_app_sqlsettings"


def _bound(statement: str, **names: str) -> str:
    """`statement` with each %(name)s replaced by the SQL expression names[name] (every one must be named)."""
    return statement % names


def _variables(*names: str, **others: str) -> dict[str, str]:
    return {**{name: f"v_{name}" for name in names}, **others}


_ENQUEUE_VARIABLES = _variables(
    "queue",
    "task",
    "payload",
    "priority",
    "run_at",
    "delay",
    "ordering_key",
    "group_key",
    "max_attempts",
    "lease_timeout",
    "channel",
    "queue_lease_timeout",
    "queue_max_attempts",
    "queue_retention",
    "dedup_key",
    "dedup_window",
    "debounce_key",
    "debounce",
    "debounce_max",
)
_ENQUEUE = _bound(sql.ENQUEUE, **_ENQUEUE_VARIABLES).strip()
_ENQUEUE_DEDUP = _bound(sql.ENQUEUE_DEDUP, **_ENQUEUE_VARIABLES).strip()
_DEDUP_OWNER = _bound(sql.DEDUP_OWNER, **_ENQUEUE_VARIABLES).strip()
_ENQUEUE_DEBOUNCE = _bound(sql.ENQUEUE_DEBOUNCE, **_ENQUEUE_VARIABLES).strip()
_LEASE = _bound(
    sql.LEASE,
    queues="ARRAY[v_queue]",
    n="v_n",
    lease_timeout="v_lease_timeout",
    worker_id="v_worker",
    term_tasks="'{}'",
    term_leases="'{}'",
    term_floors="'{}'",
).strip()
_COMPLETE = _bound(
    sql.COMPLETE_MANY, item_ids="ARRAY[v_item]", reservation_ids="ARRAY[v_reservation]", results="ARRAY[v_result]"
).strip()
_FAIL = _bound(
    sql.FAIL,
    item_id="v_item",
    reservation_id="v_reservation",
    error="v_error",
    traceback="''",
    retry_in="v_retry_in",
    force_dead="false",
    reason="''",
    outcome="NULL::varchar",
).strip()

# invalid_parameter_value: what every refusal of jobsite_enqueue raises (nothing is written).
_BAD = "USING ERRCODE = 'invalid_parameter_value'"

INSTALL = f"""
CREATE OR REPLACE FUNCTION jobsite_enqueue(
    task text, payload jsonb DEFAULT '{{}}', queue text DEFAULT NULL, priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, delay double precision DEFAULT NULL, dedup_key text DEFAULT NULL,
    dedup_window double precision DEFAULT NULL, ordering_key text DEFAULT NULL, group_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL, lease_timeout double precision DEFAULT NULL, debounce_key text DEFAULT NULL,
    debounce double precision DEFAULT NULL, debounce_max double precision DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s {SETTINGS}%ROWTYPE;
    declared {TASKS}%ROWTYPE;
    v_task text := jobsite_enqueue.task;
    v_payload jsonb := COALESCE(jobsite_enqueue.payload, '{{}}');
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
    SELECT * INTO s FROM {SETTINGS};
    IF v_task IS NULL OR v_task = '' OR length(v_task) > 200 THEN
        RAISE EXCEPTION 'task must be a non-empty name of at most 200 characters, not %', quote_nullable(v_task)
            {_BAD};
    END IF;
    SELECT * INTO declared FROM {TASKS} WHERE name = v_task;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown task: %', v_task {_BAD},
            HINT = 'jobsite_enqueue takes tasks declared with @job, published by manage.py migrate';
    END IF;
    IF declared.at_most_once AND v_max_attempts IS DISTINCT FROM 1 AND v_max_attempts IS NOT NULL THEN
        RAISE EXCEPTION '% is an at-most-once task, never retried: max_attempts=% contradicts it',
            v_task, v_max_attempts {_BAD};
    END IF;
    v_queue := COALESCE(v_queue, declared.queue, s.default_queue);
    v_max_attempts := COALESCE(v_max_attempts, declared.max_attempts);
    IF v_queue !~ '^[A-Za-z0-9_.:\\-]{{1,100}}$' THEN
        RAISE EXCEPTION 'queue name must match ^[A-Za-z0-9_.:\\-]{{1,100}}$, not %', quote_literal(v_queue) {_BAD};
    END IF;
    IF v_priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'priority must be an integer from -100 to 100, not %', v_priority {_BAD};
    END IF;
    IF v_run_at IS NOT NULL AND jobsite_enqueue.delay IS NOT NULL THEN
        RAISE EXCEPTION 'give run_at or delay, not both' {_BAD};
    END IF;
    IF v_run_at IN ('infinity', '-infinity') THEN
        RAISE EXCEPTION 'run_at must be a finite time, not %', v_run_at {_BAD};
    END IF;
    IF v_delay < 0 OR v_delay IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'delay must be a finite number >= 0, not %', v_delay {_BAD};
    END IF;
    IF v_max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be an integer >= 1, not %', v_max_attempts {_BAD};
    END IF;
    IF v_lease_timeout < 0.001 OR v_lease_timeout IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'lease_timeout must be a finite number >= 0.001, not %', v_lease_timeout {_BAD};
    END IF;
    IF v_ordering_key = '' OR length(v_ordering_key) > 200 OR v_group_key = '' OR length(v_group_key) > 200
       OR v_dedup_key = '' OR length(v_dedup_key) > 200 OR v_debounce_key = '' OR length(v_debounce_key) > 200 THEN
        RAISE EXCEPTION 'ordering_key, group_key, dedup_key and debounce_key must be non-empty strings of at most 200 '
            'characters' {_BAD};
    END IF;
    IF v_debounce_key IS NOT NULL OR v_debounce IS NOT NULL OR v_debounce_max IS NOT NULL THEN
        IF v_dedup_key IS NOT NULL THEN
            RAISE EXCEPTION 'give dedup_key (keep the first) or debounce_key (keep the latest), not both' {_BAD};
        END IF;
        IF v_debounce_key IS NULL OR v_debounce IS NULL THEN
            RAISE EXCEPTION 'a debounced enqueue takes both debounce_key and debounce (seconds)' {_BAD};
        END IF;
        IF v_debounce < 0.001 OR v_debounce IN ('NaN', 'Infinity') THEN
            RAISE EXCEPTION 'debounce must be a finite number >= 0.001, not %', v_debounce {_BAD};
        END IF;
        IF v_debounce_max < v_debounce OR v_debounce_max IN ('NaN', 'Infinity') THEN
            RAISE EXCEPTION 'debounce_max (% s) must be a finite number of at least debounce (% s)', v_debounce_max,
                v_debounce {_BAD};
        END IF;
        IF v_run_at IS NOT NULL OR v_delay <> 0 THEN
            RAISE EXCEPTION 'a debounced item is due when its key goes quiet: give debounce, not run_at or delay'
                {_BAD};
        END IF;
    END IF;
    IF octet_length(v_payload::text) > s.max_payload_bytes THEN
        RAISE EXCEPTION 'payload is % bytes, over the limit of %', octet_length(v_payload::text),
            s.max_payload_bytes {_BAD};
    END IF;
    IF jsonb_path_exists(v_payload, ('strict $.**{{' || s.max_payload_depth || '}}')::jsonpath) THEN
        RAISE EXCEPTION 'payload nested deeper than % levels', s.max_payload_depth {_BAD};
    END IF;
    v_channel := s.notify_channel;
    v_queue_lease_timeout := s.default_lease_timeout;
    v_queue_max_attempts := s.default_max_attempts;
    v_queue_retention := make_interval(days => s.default_retention_days);
    IF v_debounce_key IS NOT NULL THEN
        {_ENQUEUE_DEBOUNCE}
        INTO v_id, v_when, v_created, v_absorbed, v_notified;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'debounce key % is held by a ready item of another task in queue %',
                quote_literal(v_debounce_key), quote_literal(v_queue) {_BAD};
        END IF;
        RETURN v_id;  -- a new item of the key, or its ready item now carrying this payload
    END IF;
    IF v_dedup_key IS NULL THEN
        {_ENQUEUE}
        INTO v_id, v_when, v_created, v_notified;
        RETURN v_id;
    END IF;
    v_dedup_window := COALESCE(v_dedup_window, declared.dedup_window, s.dedup_window);
    IF v_dedup_window < 0.001 OR v_dedup_window IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'dedup_window must be a finite number >= 0.001, not %', v_dedup_window {_BAD};
    END IF;
    LOOP
        {_ENQUEUE_DEDUP}
        INTO v_id, v_when, v_created, v_notified;
        IF FOUND THEN
            RETURN v_id;
        END IF;
        {_DEDUP_OWNER}
        INTO v_id, v_when, v_created;
        IF FOUND THEN
            RETURN v_id;  -- a duplicate inside the window: the first item
        END IF;
        -- The claim vanished between the two statements (its window ended and it was pruned): claim again.
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION jobsite_lease(queue text, n integer DEFAULT 1, lease_seconds double precision DEFAULT NULL,
    worker text DEFAULT 'sql')
RETURNS TABLE (reservation_id bigint, item_id bigint, queue_id varchar, task varchar, payload jsonb, attempt integer,
    max_attempts integer, lease_expires_at timestamptz, priority smallint, ordering_key varchar,
    run_at timestamptz, created_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_queue text := jobsite_lease.queue;
    v_n integer := jobsite_lease.n;
    v_lease_timeout double precision := jobsite_lease.lease_seconds;
    v_worker text := jobsite_lease.worker;
    q {sql.QUEUE}%ROWTYPE;
BEGIN
    IF v_n IS NULL OR v_n < 1 THEN
        RAISE EXCEPTION 'n must be an integer >= 1, not %', quote_nullable(v_n) {_BAD};
    END IF;
    IF v_lease_timeout < 0.001 OR v_lease_timeout IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'lease_seconds must be a finite number >= 0.001, not %', v_lease_timeout {_BAD};
    END IF;
    SELECT * INTO q FROM {sql.QUEUE} WHERE name = v_queue;
    IF NOT FOUND OR q.paused THEN
        RETURN;
    END IF;
    IF q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL OR q.fair OR q.group_concurrency IS NOT NULL THEN
        RAISE EXCEPTION 'queue % is under flow control (a concurrency, rate or group limit, or fair): lease it with '
            'a jobsite worker', v_queue {_BAD};
    END IF;
    RETURN QUERY {_LEASE};
END
$$;

CREATE OR REPLACE FUNCTION jobsite_complete(reservation_id bigint, result jsonb DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_reservation bigint := jobsite_complete.reservation_id;
    v_result jsonb := jobsite_complete.result;
    v_item bigint;
    v_settled bigint;
BEGIN
    SELECT r.item_id INTO v_item FROM {sql.RESERVATION} r WHERE r.id = v_reservation;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    {_COMPLETE}
    INTO v_settled;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION jobsite_fail(reservation_id bigint, error text DEFAULT '',
    retry_in double precision DEFAULT 0) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_reservation bigint := jobsite_fail.reservation_id;
    v_error text := COALESCE(jobsite_fail.error, '');
    v_retry_in double precision := GREATEST(COALESCE(jobsite_fail.retry_in, 0), 0);
    v_item bigint;
    v_failed bigint;
    v_dies boolean;
BEGIN
    IF v_retry_in IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'retry_in must be a finite number >= 0, not %', v_retry_in {_BAD};
    END IF;
    SELECT r.item_id INTO v_item FROM {sql.RESERVATION} r WHERE r.id = v_reservation;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    {_FAIL}
    INTO v_failed, v_dies;
    RETURN FOUND;
END
$$;
"""

# What the SQL functions read of jobsite's settings (one row), and the task declarations they apply.
PUBLISH_SETTINGS = f"""
UPDATE {SETTINGS} SET default_queue = %(default_queue)s, dedup_window = %(dedup_window)s,
    notify_channel = %(notify_channel)s, default_lease_timeout = %(default_lease_timeout)s,
    default_max_attempts = %(default_max_attempts)s, default_retention_days = %(default_retention_days)s,
    max_payload_bytes = %(max_payload_bytes)s, max_payload_depth = %(max_payload_depth)s, published_at = now()
"""
# Upserts only: processes may declare different tasks (a worker's --import), and a name once declared stays.
PUBLISH_TASKS = f"""
INSERT INTO {TASKS} AS t (name, queue, max_attempts, dedup_window, at_most_once, published_at)
SELECT * , now() FROM unnest(%(names)s::text[], %(queues)s::text[], %(max_attempts)s::int[],
    %(dedup_windows)s::float8[], %(at_most_once)s::bool[])
ON CONFLICT (name) DO UPDATE SET queue = EXCLUDED.queue, max_attempts = EXCLUDED.max_attempts,
    dedup_window = EXCLUDED.dedup_window, at_most_once = EXCLUDED.at_most_once, published_at = now()
"""


def publish(declarations: Mapping[str, Mapping[str, Any]], using: str | None = None) -> None:
    """Write jobsite's settings and `declarations` (task name -> its item defaults, registry.item_defaults's
    shape) where jobsite_enqueue reads them. Nothing when the database has no SQL API (migrated back before it)."""
    rows = sorted(declarations.items())
    with cursor(using) as cur:
        cur.execute("SELECT to_regclass(%(table)s) IS NOT NULL", {"table": TASKS})
        if not cur.fetchone()[0]:  # migrated back to before the SQL API: nothing to publish to
            return
        cur.execute(
            PUBLISH_SETTINGS,
            {
                "default_queue": queue_settings.DEFAULT_QUEUE,
                "dedup_window": float(queue_settings.DEDUP_WINDOW),
                "notify_channel": queue_settings.NOTIFY_CHANNEL,
                "default_lease_timeout": float(queue_settings.DEFAULT_LEASE_TIMEOUT),
                "default_max_attempts": int(queue_settings.DEFAULT_MAX_ATTEMPTS),
                "default_retention_days": int(queue_settings.DEFAULT_RETENTION_DAYS),
                "max_payload_bytes": int(queue_settings.MAX_PAYLOAD_BYTES),
                "max_payload_depth": int(queue_settings.MAX_PAYLOAD_DEPTH),
            },
        )
        cur.execute(
            PUBLISH_TASKS,
            {
                "names": [name for name, _ in rows],
                "queues": [d.get("queue") for _, d in rows],
                "max_attempts": [d.get("max_attempts") for _, d in rows],
                "dedup_windows": [d.get("dedup_window") for _, d in rows],
                "at_most_once": [bool(d.get("at_most_once")) for _, d in rows],
            },
        )
