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

# The latest materializations a parking consumer waits on (checks_run.park), locked KEY SHARE before they are
# read again: a check result storing meanwhile holds FOR UPDATE, so one of the two waits for the other, and the
# reasons the park writes are the ones that result leaves (or that result rewrites them). Parameter: ids, sorted.
LOCK_MATERIALIZATIONS = """
SELECT id FROM queue_app_materialization WHERE id = ANY(%s::bigint[]) ORDER BY id FOR KEY SHARE
"""

# The reason of the consumers parked on a partition rewritten (checks_run.rewrite_blocks) by the transaction that
# changes what holds them back, when its materialization is the partition's latest (a later one's own results
# speak for it). Parameters: materialization id, reason, dataset, partition, its time, its id.
REWRITE_BLOCKS = """
UPDATE queue_app_datasetblock b SET materialization_id = %s, reason = %s
WHERE b.dataset = %s AND b.partition = %s
  AND NOT EXISTS (
      SELECT 1 FROM queue_app_materialization m
      WHERE m.dataset = b.dataset AND m.partition = b.partition AND (m.at, m.id) > (%s, %s)
  )
"""

# Per dataset, the newest materialization by time (with its checks state: the list's "checks") and the one of
# the newest partition: two index probes per name (materialization_latest, materialization_partition), every name
# in one statement.
NEWEST = """
SELECT d.name, a.partition, a.at, p.partition, p.at, a.checks
FROM unnest(%s::text[]) AS d(name)
LEFT JOIN LATERAL (
    SELECT m.partition, m.at, m.checks FROM queue_app_materialization m WHERE m.dataset = d.name
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
INSERT INTO queue_app_staleepisode (dataset, overdue_since, detected_at, started, error)
SELECT dataset, overdue_since, now(), '[]'::jsonb, ''
FROM unnest(%s::text[], %s::timestamptz[]) AS e(dataset, overdue_since)
ON CONFLICT (dataset, overdue_since) DO NOTHING
RETURNING dataset, id
"""

# What a new episode started of its dataset's producer (trigger_producer_when_stale). Parameters: partition,
# started, error, id.
STALE_STARTED = "UPDATE queue_app_staleepisode SET partition = %s, started = %s::jsonb, error = %s WHERE id = %s"


# Per dataset, how many distinct partitions are among its first N materializations by key and how many it read
# (N at most): an index-only scan of materialization_partition, every name in one statement. A dataset that
# filled N may have more partitions: PARTITION_COUNTS counts those (a loose index scan). Parameters: names, N.
PARTITION_COUNTS_SCAN = """
SELECT d.name, c.n, c.scanned
FROM unnest(%s::text[]) AS d(name)
CROSS JOIN LATERAL (
    SELECT count(DISTINCT s.partition) AS n, count(*) AS scanned FROM (
        SELECT m.partition FROM queue_app_materialization m WHERE m.dataset = d.name ORDER BY m.partition LIMIT %s
    ) s
) c
"""

# Per dataset, how many distinct partitions it has, up to a cap: a loose index scan of materialization_partition
# (one probe per partition, however many materializations each has), every name in one statement. The admin's
# list reads it for the page's datasets. Parameters: names, cap, cap.
PARTITION_COUNTS = """
SELECT d.name, c.n
FROM unnest(%s::text[]) AS d(name)
CROSS JOIN LATERAL (
    WITH RECURSIVE keys(partition, n) AS (
        (SELECT m.partition, 1 FROM queue_app_materialization m WHERE m.dataset = d.name ORDER BY m.partition LIMIT 1)
        UNION ALL
        SELECT (SELECT m.partition FROM queue_app_materialization m
                WHERE m.dataset = d.name AND m.partition > keys.partition ORDER BY m.partition LIMIT 1), keys.n + 1
        FROM keys WHERE keys.partition IS NOT NULL AND keys.n <= %s
    )
    SELECT count(partition) AS n FROM keys
) c
"""

# One dataset's newest partitions (at most a limit, by key, newest first) each with its latest materialization:
# a loose index scan down materialization_partition, then one probe per key. The dataset page's grid.
# Parameters: dataset, dataset, limit, dataset.
PARTITION_GRID = """
WITH RECURSIVE keys(partition, n) AS (
    (SELECT m.partition, 1 FROM queue_app_materialization m WHERE m.dataset = %s ORDER BY m.partition DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT m.partition FROM queue_app_materialization m
            WHERE m.dataset = %s AND m.partition < keys.partition ORDER BY m.partition DESC LIMIT 1), keys.n + 1
    FROM keys WHERE keys.partition IS NOT NULL AND keys.n < %s
)
SELECT k.partition, l.id, l.at, l.source, l.rows, l.bytes, l.spark_run_id, l.checks
FROM keys k
CROSS JOIN LATERAL (
    SELECT m.id, m.at, m.source, m.rows, m.bytes, m.spark_run_id, m.checks FROM queue_app_materialization m
    WHERE m.dataset = %s AND m.partition = k.partition ORDER BY m.at DESC LIMIT 1
) l
WHERE k.partition IS NOT NULL
ORDER BY k.partition DESC
"""


# A multi-dimension dataset's matrix (status.partition_matrix), its time dimension first: the newest %(rows)s time
# keys by probes (a key "2026-11-30|eu" sorts after "2026-11-30" and before "2026-12-01"), then every partition
# from the oldest of them in one range scan, each with its latest materialization, at most %(cap)s, the newest.
MATRIX_GRID = """
WITH RECURSIVE times(t, n) AS (
    (SELECT split_part(m.partition, '|', 1), 1 FROM queue_app_materialization m
     WHERE m.dataset = %(ds)s ORDER BY m.partition DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT split_part(m.partition, '|', 1) FROM queue_app_materialization m
            WHERE m.dataset = %(ds)s AND m.partition < times.t ORDER BY m.partition DESC LIMIT 1), times.n + 1
    FROM times WHERE times.t IS NOT NULL AND times.n < %(rows)s
)
SELECT DISTINCT ON (m.partition) m.partition, m.id, m.at, m.source, m.rows, m.bytes, m.spark_run_id, m.checks
FROM queue_app_materialization m
WHERE m.dataset = %(ds)s AND m.partition >= (SELECT min(t) FROM times)
ORDER BY m.partition DESC, m.at DESC
LIMIT %(cap)s
"""

# -- data-aware triggers (triggers.py) ---------------------------------------------------------------------------

# The (consumer, partition) state rows one upstream partition moves (one; through a mapping, every partition it
# feeds), made sure of and locked in one statement: a concurrent recorder of another upstream of a pair waits
# here until this transaction ends, then (READ COMMITTED: the conflicting row's newest version) reads what it
# committed. Locked in the order given (sorted by the caller: the rows are inserted, or
# their conflicts locked, in the SELECT's order, so concurrent recorders lock them in one order). Parameters:
# consumer, partitions.
TRIGGER_LOCK_MANY = """
INSERT INTO queue_app_triggerstate (consumer, partition, pending, seen, updated_at)
SELECT %s, t.p, '{}'::jsonb, '{}'::jsonb, now() FROM unnest(%s::text[]) WITH ORDINALITY AS t(p, n) ORDER BY t.n
ON CONFLICT (consumer, partition) DO UPDATE SET updated_at = EXCLUDED.updated_at
RETURNING id, partition, pending, seen, timer_item_id
"""

# The state rows not ready, written back under their locks in one statement. Parameter: [{"id", "pending",
# "seen"}] as JSON.
TRIGGER_SAVE_MANY = """
UPDATE queue_app_triggerstate s SET pending = v.pending, seen = v.seen, due_at = NULL, timer_item_id = NULL
FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, pending jsonb, seen jsonb)
WHERE s.id = v.id
"""

# The state row written back under its lock. Parameters: pending, seen, debounce seconds (None: no timer),
# timer item id, id.
TRIGGER_SAVE = """
UPDATE queue_app_triggerstate
SET pending = %s::jsonb, seen = %s::jsonb,
    due_at = CASE WHEN %s::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => %s::float8) END,
    timer_item_id = %s
WHERE id = %s
RETURNING due_at
"""

# A debounce timer's state row, locked; None when it is gone. Parameters: consumer, partition.
TRIGGER_TIMER = """
SELECT id, pending, seen, due_at, timer_item_id, due_at > now() FROM queue_app_triggerstate
WHERE consumer = %s AND partition = %s FOR UPDATE
"""

TRIGGER_TIMER_SET = "UPDATE queue_app_triggerstate SET timer_item_id = %s WHERE id = %s"

# A pending set dropped (its consumer is no longer declared).
TRIGGER_CLEAR = """
UPDATE queue_app_triggerstate SET pending = '{}'::jsonb, due_at = NULL, timer_item_id = NULL WHERE id = %s
"""

# Whether a debounce timer's queue item can still run (ready, or reserved by a worker).
TIMER_ALIVE = "SELECT EXISTS (SELECT 1 FROM queue_app_queueitem WHERE id = %s AND state IN ('ready', 'reserved'))"

# The state row written back with its pending set cleared and the fire inserted, in one round trip: one fire per
# (consumer, partition, upstream set), so a second recorder of the same set inserts nothing (and starts nothing).
# Parameters: seen, state id, then consumer, partition, fingerprint, upstream.
TRIGGER_SAVE_AND_FIRE = """
WITH saved AS (
    UPDATE queue_app_triggerstate SET pending = '{}'::jsonb, seen = %s::jsonb, due_at = NULL, timer_item_id = NULL
    WHERE id = %s
)
INSERT INTO queue_app_triggerfire (consumer, partition, fingerprint, upstream, started, error, at)
VALUES (%s, %s, %s, %s::jsonb, '[]'::jsonb, '', now())
ON CONFLICT (consumer, partition, fingerprint) DO NOTHING
RETURNING id
"""

TRIGGER_FIRED = "UPDATE queue_app_triggerfire SET started = %s::jsonb, error = %s WHERE id = %s"

# The partitions of `keys` a dataset has a materialization of whose latest did not fail its blocking checks
# (`dataset materialize --missing-only`: a failed-check partition is taken again). Parameters: dataset, keys.
MATERIALIZED_KEYS = """
SELECT l.partition FROM (
    SELECT DISTINCT ON (m.partition) m.partition, m.checks FROM queue_app_materialization m
    WHERE m.dataset = %s AND m.partition = ANY(%s::text[])
    ORDER BY m.partition, m.at DESC, m.id DESC
) l
WHERE l.checks <> 'failed'
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
