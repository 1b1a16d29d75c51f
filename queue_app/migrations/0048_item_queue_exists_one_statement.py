"""The item -> queue check of an INSERT (trigger item_queue_exists, migration 0008) in one statement instead of
three: the distinct queues of the inserted rows, each locked FOR KEY SHARE where it exists, the first missing one
found, in one query. The same rule and the same lock (a concurrent DELETE of a named queue waits for the
inserting transaction, then sees its items and is refused; a queue deleted while the insert waited for its lock is
found missing, READ COMMITTED's recheck of the locked row); the same error.

Measured on one connection, 300 single-item enqueues with the table's triggers on and off alternated
(`session_replication_role`): the trigger's share of an enqueue 0.11-0.14 ms (four runs), against 0.19-0.23
with the three statements (two runs between them; docs/benchmarks.md, issue 47).
"""

from django.db import migrations

MESSAGE = """
        RAISE foreign_key_violation USING
            MESSAGE = format('queue item names queue %L, which does not exist', missing),
            HINT = 'Create the queue first (engine.enqueue and engine.ensure_queue do).';"""

ONE_STATEMENT = f"""
CREATE OR REPLACE FUNCTION queue_app_item_queue_exists() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    missing varchar;
BEGIN
    -- Every named queue that exists is locked (no row passes the filter, so the scan visits them all): the lock
    -- the constraint's check took, so a DELETE of one of these queues waits for this transaction.
    SELECT d.queue_id INTO missing
    FROM (SELECT DISTINCT queue_id FROM added) d
    LEFT JOIN LATERAL (SELECT 1 AS found FROM queue_app_queue q WHERE q.name = d.queue_id FOR KEY SHARE) q ON true
    WHERE q.found IS NULL
    LIMIT 1;
    IF FOUND THEN{MESSAGE}
    END IF;
    RETURN NULL;
END
$$;
"""

THREE_STATEMENTS = f"""
CREATE OR REPLACE FUNCTION queue_app_item_queue_exists() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    names varchar[];
    missing varchar;
BEGIN
    SELECT array_agg(queue_id) INTO names FROM (SELECT DISTINCT queue_id FROM added) d;
    IF names IS NULL THEN
        RETURN NULL;
    END IF;
    -- The lock the constraint's check took: a DELETE of one of these queues waits for this transaction.
    PERFORM 1 FROM queue_app_queue WHERE name = ANY(names) FOR KEY SHARE;
    SELECT n INTO missing FROM unnest(names) AS n
    WHERE NOT EXISTS (SELECT 1 FROM queue_app_queue q WHERE q.name = n) LIMIT 1;
    IF FOUND THEN{MESSAGE}
    END IF;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0047_layer_models_move")]

    operations = [migrations.RunSQL(ONE_STATEMENT, reverse_sql=THREE_STATEMENTS)]
