"""The lease's ordering-key check as a function, queue_app_ordering_key_free(), called only for an item that has
a key: the same condition, read with the lease statement's own snapshot (a STABLE function runs in the calling
statement's), replacing the correlated NOT EXISTS subquery the lease statements carried inline.

Why: PostgreSQL sets up a subquery's plan on every execution of the statement that holds it, whether or not a row
ever reaches it, and an item without an ordering key (most) never does. Measured on one connection, a lease of
one ready item without a key, 400 rounds each, the variants interleaved (issue 47, docs/benchmarks.md): 0.69 ms
with the function against 0.80 with the subquery back to back, 1.36 against 1.47 after a 20 ms pause. A lease of
500 items that all have keys (distinct) costs the same or less: 25.7 against 27.0 ms (median of 16).

The lease statement's terms are looked up in their arrays by position too (sql._TERM) instead of a CTE over their
unnest. The SQL API's jobsite_lease runs the engine's lease statement (engine/sql_api.py), so it is installed
again here: LEASE_FUNCTION is a frozen copy of the module's, and the reverse restores 0025's
(tests/core/in_process/test_sql_api_source.py compares the migrated functions with the module's).
"""

from importlib import import_module

from django.db import migrations

FUNCTION = """
CREATE FUNCTION queue_app_ordering_key_free(p_queue varchar, p_key varchar, p_id bigint) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    -- Leasable when no older item of its key is still open, and no younger one is in flight: enqueues of one key
    -- may commit out of id order, and the younger one may already be out when the older one becomes visible.
    -- Index item_ordering_open; its predicate is (ordering_key IS NOT NULL AND state IN ('ready', 'reserved')).
    RETURN NOT EXISTS (
        SELECT 1 FROM queue_app_queueitem o
        WHERE o.queue_id = p_queue AND o.ordering_key = p_key
          AND o.ordering_key IS NOT NULL
          AND o.state IN ('ready', 'reserved') AND o.id <> p_id
          AND (o.id < p_id OR (o.state = 'reserved' AND o.visible_at > now())));
END
$$;
"""

LEASE_FUNCTION = r"""
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
    q queue_app_queue%ROWTYPE;
BEGIN
    IF v_n IS NULL OR v_n < 1 THEN
        RAISE EXCEPTION 'n must be an integer >= 1, not %', quote_nullable(v_n) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_lease_timeout < 0.001 OR v_lease_timeout IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION 'lease_seconds must be a finite number >= 0.001, not %', v_lease_timeout USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO q FROM queue_app_queue WHERE name = v_queue;
    IF NOT FOUND OR q.paused THEN
        RETURN;
    END IF;
    IF q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL OR q.fair OR q.group_concurrency IS NOT NULL THEN
        RAISE EXCEPTION 'queue % is under flow control (a concurrency, rate or group limit, or fair): lease it with '
            'a jobsite worker', v_queue USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY WITH picked AS (
    -- One ordered scan of item_fetch per queue (queue_id = q.name), each stopping after n rows it could lock,
    -- then the best n of those. `queue_id = ANY(array)` cannot walk the index in order (before PostgreSQL 17):
    -- it sorted every due row of the queues on each lease, and its cost estimate switched JIT on.
    SELECT c.* FROM unnest(ARRAY[v_queue]::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT i.id, i.queue_id, i.task, i.state AS prev_state, i.reservation_id AS prev_reservation, i.attempts,
               i.lease_timeout, i.priority, i.visible_at
        FROM queue_app_queueitem i
        WHERE i.queue_id = q.name
          AND i.state IN ('ready', 'reserved')
          AND i.visible_at <= now()
          AND (i.state = 'ready' OR i.attempts < i.max_attempts)
          AND (i.ordering_key IS NULL OR queue_app_ordering_key_free(i.queue_id, i.ordering_key, i.id))
        ORDER BY i.priority DESC, i.visible_at, i.id
        LIMIT v_n
        FOR UPDATE OF i SKIP LOCKED
    ) c
    ORDER BY c.priority DESC, c.visible_at, c.id
    LIMIT v_n
), expired AS (
    UPDATE queue_app_reservation r SET outcome = 'expired', finished_at = now()
    FROM picked p
    WHERE p.prev_state = 'reserved' AND r.id = p.prev_reservation AND r.outcome IS NULL
), leased AS (
    -- The picked rows by primary key alone, no join: a join to a CTE is planned on a guessed row count, and a
    -- guess of one row for 5,000 made each probe walk the whole id array (1.8 s). Everything the row needs is
    -- on the row itself: its next attempt, its task's lease (from the terms), a new reservation id.
    UPDATE queue_app_queueitem i
    SET state = 'reserved', reservation_id = nextval('queue_app_reservation_id_seq'), attempts = i.attempts + 1,
        visible_at = now() + make_interval(secs => GREATEST(COALESCE(
            ('{}'::float8[])[array_position('{}'::text[], i.task::text)], i.lease_timeout, v_lease_timeout,
            (SELECT q.lease_timeout FROM queue_app_queue q WHERE q.name = i.queue_id)
        ), COALESCE(('{}'::float8[])[array_position('{}'::text[], i.task::text)], 0))),
        updated_at = now()
    WHERE i.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING i.reservation_id, i.id AS item_id, i.queue_id, i.task, i.payload, i.attempts AS attempt,
              i.max_attempts, i.visible_at AS lease_expires_at, i.priority, i.ordering_key, i.run_at, i.created_at
), res AS (
    INSERT INTO queue_app_reservation
        (id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at, error, traceback)
    SELECT reservation_id, item_id, attempt, v_worker, now(), lease_expires_at, now(), '', '' FROM leased
)
SELECT reservation_id, item_id, queue_id, task, payload, attempt, max_attempts, lease_expires_at,
       priority,
       ordering_key, run_at, created_at FROM leased;
END
$$;
"""


def _function(install: str, name: str) -> str:
    """The CREATE OR REPLACE FUNCTION statement of `name` in an earlier migration's INSTALL (its frozen copy)."""
    start = install.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return install[start : install.index("$$;", install.index("AS $$", start) + 5) + 3]


# The reverse: the function as migration 0025 installed it.
LEASE_FUNCTION_0025 = _function(import_module("queue_app.migrations.0025_sql_api").INSTALL, "jobsite_lease")


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0048_item_queue_exists_one_statement")]

    operations = [
        migrations.RunSQL(FUNCTION, reverse_sql="DROP FUNCTION queue_app_ordering_key_free(varchar, varchar, bigint)"),
        migrations.RunSQL(LEASE_FUNCTION, reverse_sql=LEASE_FUNCTION_0025),
    ]
