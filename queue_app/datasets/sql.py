"""The datasets' SQL statements, in one place: the record written in a producer's settle (hot path), the list's
read of every dataset's newest materializations, and the sync of declarations to rows."""

# One statement, so it is atomic without a savepoint of its own: the dataset's row made sure of (ON CONFLICT DO
# NOTHING takes no lock on an existing row: concurrent records of one dataset never wait on each other), the
# materialization inserted, and, when it is usable at once (no blocking checks), the consumers parked on its
# partition released (their DatasetBlock rows deleted and returned: the caller makes their items due), in the
# same round trip. Parameters: name, config, declared_in, usable, the partition again, then the
# materialization's columns (the checks state last: checks_run.initial_state).
RECORD = """
WITH dataset AS (
    INSERT INTO queue_app_dataset (name, config, declared_in, synced_at) VALUES (%s, %s::jsonb, %s, now())
    ON CONFLICT (name) DO NOTHING
), released AS (
    DELETE FROM queue_app_datasetblock b WHERE %s AND b.dataset = %s AND b.partition = %s RETURNING b.item_id
)
INSERT INTO queue_app_materialization (dataset, partition, at, rows, bytes, files, schema_fingerprint, metadata,
    source, spark_run_id, workflow_step_id, item_id, checks)
VALUES (%s, %s, now(), %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s)
RETURNING id, at, ARRAY(SELECT DISTINCT item_id FROM released)
"""

# The consumers parked on a partition, released when a materialization of it becomes usable after its record
# (its last blocking check passed, or an override): their rows deleted, their item ids returned.
RELEASE_BLOCKS = """
DELETE FROM queue_app_datasetblock WHERE dataset = %s AND partition = %s RETURNING item_id
"""

# Per dataset, the newest materialization by time and the one of the newest partition: two index probes per
# name (materialization_latest, materialization_partition), every name in one statement.
NEWEST = """
SELECT d.name, a.partition, a.at, p.partition, p.at
FROM unnest(%s::text[]) AS d(name)
LEFT JOIN LATERAL (
    SELECT m.partition, m.at FROM queue_app_materialization m WHERE m.dataset = d.name
    ORDER BY m.at DESC, m.id DESC LIMIT 1
) a ON true
LEFT JOIN LATERAL (
    SELECT m.partition, m.at FROM queue_app_materialization m WHERE m.dataset = d.name
    ORDER BY m.partition DESC LIMIT 1
) p ON true
"""


# Every declared dataset's snapshot in one statement; a row whose snapshot is unchanged is not rewritten.
SYNC = """
INSERT INTO queue_app_dataset (name, config, declared_in, synced_at)
SELECT name, config, declared_in, now() FROM unnest(%s::text[], %s::jsonb[], %s::text[]) AS d(name, config, declared_in)
ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config, declared_in = EXCLUDED.declared_in,
    synced_at = EXCLUDED.synced_at
WHERE (queue_app_dataset.config, queue_app_dataset.declared_in) IS DISTINCT FROM (EXCLUDED.config, EXCLUDED.declared_in)
"""


# The stale check's episodes, all in one statement: each (dataset, overdue_since) not yet recorded is inserted and
# returned. A concurrent check inserting the same key waits for the first to commit, then inserts nothing.
STALE_EPISODES = """
INSERT INTO queue_app_staleepisode (dataset, overdue_since, detected_at)
SELECT dataset, overdue_since, now() FROM unnest(%s::text[], %s::timestamptz[]) AS e(dataset, overdue_since)
ON CONFLICT (dataset, overdue_since) DO NOTHING
RETURNING dataset
"""


# The checks' pending results of a materialization just recorded, one row per check, in one statement.
CHECKS_PENDING = """
INSERT INTO queue_app_datasetcheckresult (materialization_id, dataset, partition, check_name, severity, blocking,
    figures, message)
SELECT %s, %s, %s, c.name, c.severity, c.blocking, '{}'::jsonb, ''
FROM unnest(%s::text[], %s::text[], %s::boolean[]) AS c(name, severity, blocking)
"""

# What holds a consumer back: of the (dataset, partition) pairs it reads (partition NULL: every partition), the
# latest materialization of each partition whose checks are pending or failed. The latest per partition comes
# from the materialization_partition index (dataset, partition, at DESC); a NULL partition reads the dataset's
# every partition (DISTINCT ON, one pass over that dataset's rows of the index).
UNUSABLE = """
SELECT q.dataset, l.partition, l.id, l.checks
FROM unnest(%s::text[], %s::text[]) AS q(dataset, partition)
CROSS JOIN LATERAL (
    SELECT DISTINCT ON (m.partition) m.partition, m.id, m.checks
    FROM queue_app_materialization m
    WHERE m.dataset = q.dataset AND (q.partition IS NULL OR m.partition = q.partition)
    ORDER BY m.partition, m.at DESC, m.id DESC
) l
WHERE l.checks IN ('pending', 'failed')
ORDER BY q.dataset, l.partition
"""
