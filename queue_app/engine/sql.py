"""Every SQL statement of the queue's hot path, named, in one place (River keeps its queries the same way).

Conventions:
- Parameters are named (`%(name)s`); each statement is one round trip.
- Every settle is fenced: it matches `reservation_id = %(reservation_id)s AND state = 'reserved'`, so a
  reservation that is no longer current changes nothing (the caller sees zero rows and raises StaleReservation).
- `visible_at` is SQS's visibility: the due time while ready, the lease deadline while reserved. The partial
  index `item_fetch` (queue, priority DESC, visible_at, id) WHERE state IN ('ready','reserved') serves the fetch;
  done, dead and cancelled rows are not in it, so history never slows a lease.
"""

ITEM = "queue_app_queueitem"
RESERVATION = "queue_app_reservation"
DEAD_LETTER = "queue_app_deadletter"
QUEUE = "queue_app_queue"
DEDUP = "queue_app_dedupclaim"
ITEM_HISTORY = "queue_app_itemhistory"  # finished items moved out of ITEM (engine/history.py), partitioned by day
RESERVATION_HISTORY = "queue_app_reservationhistory"
RESERVATION_SEQUENCE = "queue_app_reservation_id_seq"  # its id column's (pg_get_serial_sequence; checked by a test)
ITEM_SEQUENCE = "queue_app_queueitem_id_seq"  # the same for items (a fan-out draws ids from it first)
WORKFLOW_STEP = "queue_app_workflowstep"  # read by the traced lease (a step item's workflow and name)


# The state test of a row found by its primary key, written as an expression (`state || ''`) so that PostgreSQL
# cannot match it to a partial index's predicate. Planned on out-of-date statistics (a queue filled since its
# last ANALYZE) a partial index looks empty, and reading it whole then looks cheaper than a primary-key probe:
# every settle read the whole in-flight (item_in_flight) or done set (the task index of the time).
# tests/core/in_process/test_engine_plans.py plans every statement on such statistics.
def _state_is(state: str, alias: str = "") -> str:
    return f"({alias + '.' if alias else ''}state || '') = '{state}'"


# -- queues ---------------------------------------------------------------------------------------------------

# Also the first CTE of every enqueue statement: a queue is created by the enqueue that first names it, in the
# same round trip and transaction, with no per-process "known queues" cache that a deleted (or test-flushed)
# queue row would make stale. ON CONFLICT DO NOTHING on an existing queue is an index probe: nothing written.
ENSURE_QUEUE = f"""
INSERT INTO {QUEUE} (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
VALUES (%(queue)s, false, NULL, %(queue_lease_timeout)s, %(queue_max_attempts)s, %(queue_retention)s, now())
ON CONFLICT (name) DO NOTHING
"""

# A queue that leases by group key: fair, or a group limit.
_GROUPED = "(fair OR group_concurrency IS NOT NULL)"
# A queue under flow control (a concurrency limit, a rate limit, a group limit or fair leasing) or with priority
# aging is leased one queue at a time under its row lock (engine/lease.py), never by the many-queue statements:
# so a queue without them keeps the many-queue lease's plan and cost as they were.
_FLOW_CONTROLLED = f"(concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL OR {_GROUPED} OR aging_rate IS NOT NULL)"

# Serializes leasers of one flow-controlled queue and says what room it has. NO KEY UPDATE, not UPDATE: leasers
# still exclude each other, but the FOR KEY SHARE lock an enqueue takes on its queue row (trigger
# item_queue_exists) is not blocked by a lease. The rate limit counts leases per window of `rate_period`
# seconds aligned to the clock (window n covers [n * period, (n + 1) * period) since the epoch): `rate_room` is
# what the current window has left. A leaser whose transaction clock (now(): its start, before it waited for
# the lock) is in a window older than the one counted gets no room, so the leases stamped with a window never
# outnumber its limit.
LOCK_FLOW_QUEUE = f"""
SELECT q.concurrency_limit, q.rate_limit,
       q.rate_limit - CASE WHEN q.rate_window_start = w.start THEN q.rate_window_count
                           WHEN q.rate_window_start > w.start THEN q.rate_limit ELSE 0 END AS rate_room,
       w.start, {_GROUPED}, q.group_concurrency, q.group_weights, q.aging_rate
FROM {QUEUE} q
CROSS JOIN LATERAL (SELECT to_timestamp(floor(extract(epoch FROM now()) / q.rate_period) * q.rate_period)) w(start)
WHERE q.name = %(queue)s AND NOT q.paused AND {_FLOW_CONTROLLED}
FOR NO KEY UPDATE OF q
"""
# What is in flight (a lease that expired is not: it can be taken again).
IN_FLIGHT = f"""
SELECT count(*) FROM {ITEM}
WHERE queue_id = %(queue)s AND state = 'reserved' AND visible_at > now()
"""
# Count a lease's items against the rate window (still under the queue's row lock).
SPEND_RATE = f"""
UPDATE {QUEUE} SET rate_window_count = CASE WHEN rate_window_start = %(window)s THEN rate_window_count + %(spent)s
                                            ELSE %(spent)s END,
                   rate_window_start = %(window)s
WHERE name = %(queue)s
"""

# -- enqueue --------------------------------------------------------------------------------------------------

_ITEM_COLUMNS = """(id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts,
    lease_timeout, dedup_key, ordering_key, group_key, error, created_at, updated_at{trace})"""

_DUE = "COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s))"
# An item without its own max_attempts takes its queue's; a queue created by this very statement (invisible to
# its snapshot) has the default the ENSURE_QUEUE CTE just inserted.
_MAX_ATTEMPTS = f"""COALESCE(%(max_attempts)s, (SELECT max_attempts FROM {QUEUE} WHERE name = %(queue)s),
    %(queue_max_attempts)s)"""
# An item queued without a group key into a queue that leases by group (fair, or a group limit) joins the group
# '' (the lease reads groups from the index item_group, which holds keyed items only). The queue row is read
# FOR KEY SHARE (the lock the statement's trigger item_queue_exists takes anyway, held to commit): a change that
# turns grouping on locks the row FOR UPDATE before it gives the queue's open items without a key the group ''
# (services.set_queue_options), so it waits for every enqueue that read the queue ungrouped to commit first.
_GROUP_KEY = f"""COALESCE(%(group_key)s,
    (SELECT CASE WHEN {_GROUPED} THEN '' END FROM {QUEUE} WHERE name = %(queue)s FOR KEY SHARE))"""

# The plain enqueue reads its queue row once (`qr`): one probe of the primary key, locked FOR KEY SHARE (the lock
# _GROUP_KEY and the trigger item_queue_exists take), for the queue's max_attempts and grouping both, and the
# queue is created (as ENSURE_QUEUE does) only when that read found no row. The same outcomes as ENSURE_QUEUE's
# upsert and the two subqueries, with one probe instead of three and no speculative insertion into an existing
# queue. The lock makes the read current under READ COMMITTED: an uncommitted DELETE of the queue is waited for,
# and a queue deleted (committed) since the statement's snapshot is read as missing, so it is created again, as
# the upsert did (ON CONFLICT DO NOTHING still settles two enqueues creating one queue at once). A queue created
# by this very statement is invisible to its snapshot: its defaults come from the parameters.
_ENQUEUE = f"""
WITH qr AS (
    SELECT max_attempts, CASE WHEN {_GROUPED} THEN '' END AS group_default FROM {QUEUE}
    WHERE name = %(queue)s FOR KEY SHARE
), q AS (
    INSERT INTO {QUEUE} (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
    SELECT %(queue)s, false, NULL, %(queue_lease_timeout)s, %(queue_max_attempts)s, %(queue_retention)s, now()
    WHERE NOT EXISTS (SELECT FROM qr)
    ON CONFLICT (name) DO NOTHING
), ins AS (
    INSERT INTO {ITEM} {_ITEM_COLUMNS}
    VALUES (DEFAULT, %(queue)s, %(task)s, %(payload)s::jsonb, 'ready', %(priority)s, {_DUE}, {_DUE}, 0,
            COALESCE(%(max_attempts)s, (SELECT max_attempts FROM qr), %(queue_max_attempts)s), %(lease_timeout)s,
            NULL, %(ordering_key)s, COALESCE(%(group_key)s, (SELECT group_default FROM qr)), '', now(),
            now(){{trace_value}})
    RETURNING id, run_at, created_at
)
SELECT id, run_at, created_at, {{probe}}pg_notify(%(channel)s, %(queue)s)::text FROM ins
"""
# The item's trace context (engine/tracing.py) is a column only the traced variants name: with tracing off the
# statements are the ones the SQL API (engine/sql_api.py) binds, unchanged.
_UNTRACED = {"trace": "", "trace_value": "", "probe": ""}
_TRACED = {"trace": ", trace_context", "trace_value": ", %(trace_context)s", "probe": ""}
ENQUEUE = _ENQUEUE.format(**_UNTRACED)
ENQUEUE_TRACED = _ENQUEUE.format(**_TRACED)

# -- hand-off: an idle worker's offer taken by the enqueue itself (engine/handoff.py) ------------------------
# A worker with room and nothing ready in its queues offers one slot (a HANDOFF row, inserted on its listening
# connection, which holds the session advisory lock (HANDOFF_LOCK_NAMESPACE, lock_key) while it lives). A plain
# enqueue in a transaction of its own then takes an offer of a live worker for its queue, writes its item already
# reserved for that worker with its reservation, and NOTIFYs the worker's own channel with the leased row: the
# worker starts the item from the notification, with no lease round trip. An offer is taken only when the queue
# is not paused or under flow control and no due item of the same priority or a higher one waits in the queue
# (the item does not pass what is waiting), and only one of a live worker (a try of the lock's
# shared form succeeds only once its session is gone, and never blocks another enqueuer). SKIP LOCKED: two
# enqueues never take one offer. Otherwise the item is queued ready and the queue's channel notified, as ENQUEUE
# does. The lease lasts what the worker's lease would have given it:
# the task's term, else the item's, else the queue's (never under the term's floor).
HANDOFF = "queue_app_handoff"
HANDOFF_LOCK_NAMESPACE = 0x6A6F68  # "joh"
# Whether any worker offered a slot for the queue, as of the statement's start (the offer an enqueue takes
# included): what engine/handoff.py's `saw` records, and `statement` picks the next enqueue's statement by.
_OFFERS_THERE = f"EXISTS (SELECT FROM {HANDOFF} h WHERE h.queues IS NULL OR h.queues ? %(queue)s)"
# ENQUEUE, and whether an offer is there: the statement of an eligible enqueue while no offer was seen lately
# (a busy deployment's), which costs ENQUEUE and a read of the (empty) offer table; ENQUEUE_HANDOFF, whose
# taking of an offer costs 0.15 ms more on every enqueue that finds none, is sent only once offers are seen.
ENQUEUE_PROBING = _ENQUEUE.format(**{**_UNTRACED, "probe": f"{_OFFERS_THERE}, "})

ENQUEUE_HANDOFF = f"""
WITH qr AS (
    SELECT max_attempts, lease_timeout, (paused OR {_FLOW_CONTROLLED}) AS held,
           CASE WHEN {_GROUPED} THEN '' END AS group_default
    FROM {QUEUE} WHERE name = %(queue)s::text FOR KEY SHARE
), q AS (
    INSERT INTO {QUEUE} (name, paused, concurrency_limit, lease_timeout, max_attempts, retention, created_at)
    SELECT %(queue)s::text, false, NULL, %(queue_lease_timeout)s, %(queue_max_attempts)s, %(queue_retention)s, now()
    WHERE NOT EXISTS (SELECT FROM qr)
    ON CONFLICT (name) DO NOTHING
), offer AS (
    DELETE FROM {HANDOFF} h WHERE h.id = (
        SELECT o.id FROM {HANDOFF} o
        WHERE (o.queues IS NULL OR o.queues ? %(queue)s::text)
          -- Both checks name the offer row (o.id), so each runs per offer found, and not at all on an enqueue
          -- that finds none (the busy case): uncorrelated, they would run first on every enqueue.
          AND EXISTS (SELECT FROM qr WHERE NOT held AND o.id IS NOT NULL)
          -- The notification must fit NOTIFY's 8,000 bytes: the payload as jsonb renders it (a space after each
          -- comma and colon: up to half as long again as the caller's JSON), the task and queue names, and less
          -- than 400 bytes of ids and times.
          AND octet_length(json_build_object('q', %(queue)s::text, 't', %(task)s::text, 'p', %(payload)s::jsonb)::text)
              <= 7600
          AND (
              -- No due item of this priority or a higher one: ready, or leased and its lease lapsed with attempts
              -- left. Read from item_fetch, whose entries carry visible_at: the items in flight (their leases
              -- ahead) and those not yet due are passed over in the index, without a visit to their rows. Only
              -- lapsed leases on their last attempt are visited and passed: the rescue takes them to the dead
              -- letters within seconds. The first such item in item_fetch's order, not a NOT EXISTS: PostgreSQL
              -- makes a NOT EXISTS an anti join, whose plan without the parameters' values costs a read of an
              -- average queue's open items. A project's connection keeps PostgreSQL's plan choice, which then
              -- found that plan dearer than planning anew, and planned this statement on every enqueue (0.35 ms
              -- of 1.2). Ordered and limited, its plan is an index probe whatever the values.
              SELECT i.id FROM {ITEM} i
              WHERE i.queue_id = %(queue)s::text AND i.state IN ('ready', 'reserved')
                AND i.priority >= %(priority)s AND i.visible_at <= now()
                AND (i.state = 'ready' OR i.attempts < i.max_attempts) AND o.id IS NOT NULL
              ORDER BY i.priority DESC, i.visible_at, i.id LIMIT 1) IS NULL
          AND NOT pg_try_advisory_xact_lock_shared({HANDOFF_LOCK_NAMESPACE}, o.lock_key)
        LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING h.id, h.worker_id, h.channel, h.terms
), ins AS (
    -- One row, joined to the offer taken (or none) and the queue row (or none: a queue created here).
    INSERT INTO {ITEM} {_ITEM_COLUMNS.format(trace="")[:-1]}, reservation_id)
    SELECT DEFAULT_ID, %(queue)s::text, %(task)s::text, %(payload)s::jsonb,
           CASE WHEN o.id IS NULL THEN 'ready' ELSE 'reserved' END, %(priority)s, now(),
           CASE WHEN o.id IS NULL THEN now() ELSE now() + make_interval(secs => GREATEST(
               COALESCE((o.terms -> %(task)s::text ->> 0)::float8, %(lease_timeout)s, qr.lease_timeout),
               COALESCE((o.terms -> %(task)s::text ->> 1)::float8, 0))) END,
           CASE WHEN o.id IS NULL THEN 0 ELSE 1 END,
           COALESCE(%(max_attempts)s, qr.max_attempts, %(queue_max_attempts)s), %(lease_timeout)s,
           NULL, NULL, qr.group_default, '', now(), now(),
           CASE WHEN o.id IS NOT NULL THEN nextval('{RESERVATION_SEQUENCE}') END
    FROM (SELECT) AS one LEFT JOIN offer o ON true LEFT JOIN qr ON true
    RETURNING id, run_at, created_at, reservation_id, visible_at, attempts, max_attempts
), res AS (
    INSERT INTO {RESERVATION}
        (id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at, error, traceback)
    SELECT ins.reservation_id, ins.id, ins.attempts, o.worker_id, now(), ins.visible_at, now(), '', ''
    FROM ins, offer o
)
-- An offer taken says offers are there: the table is read again only when none was.
SELECT ins.id, ins.run_at, ins.created_at, o.id IS NOT NULL OR {_OFFERS_THERE},
       CASE WHEN o.id IS NULL THEN pg_notify(%(channel)s, %(queue)s::text)
            ELSE pg_notify(o.channel, json_build_object(
                'h', o.id, 'r', ins.reservation_id, 'i', ins.id, 'q', %(queue)s::text, 't', %(task)s::text,
                'p', %(payload)s::jsonb, 'a', ins.attempts, 'm', ins.max_attempts, 'e', ins.visible_at,
                'o', %(priority)s::int, 'u', ins.run_at, 'c', ins.created_at)::text) END::text
FROM ins LEFT JOIN offer o ON true
""".replace("DEFAULT_ID", f"nextval(pg_get_serial_sequence('{ITEM}', 'id'))")

# The worker's offer, on its listening connection (whose session holds the lock): its rows of before (a listening
# connection lost) and the offers of workers gone (their lock free) are cleared first.
OFFER = f"""
WITH cleared AS (
    DELETE FROM {HANDOFF}
    WHERE worker_id = %(worker_id)s OR pg_try_advisory_xact_lock_shared({HANDOFF_LOCK_NAMESPACE}, lock_key)
)
INSERT INTO {HANDOFF} (worker_id, channel, lock_key, queues, terms, offered_at)
VALUES (%(worker_id)s, %(channel)s, %(lock_key)s, %(queues)s::jsonb, %(terms)s::jsonb, now())
RETURNING id
"""
# Withdrawn: the row is gone; none: an enqueue took it (the DELETE waited for that enqueue to commit), and its
# notification is on its way.
WITHDRAW = f"DELETE FROM {HANDOFF} WHERE id = %(offer)s RETURNING id"
HOLD_OFFER_LOCK = "SELECT pg_advisory_lock(%(namespace)s, %(lock_key)s)"

# The claim row decides, under concurrency, which enqueue owns the key: the first inserts it; the others wait
# on its row lock, then see an unexpired claim and get no row back (a duplicate). An expired claim is taken over.
_ENQUEUE_DEDUP = f"""
WITH q AS ({ENSURE_QUEUE}), claim AS (
    INSERT INTO {DEDUP} AS c (queue_id, key, item_id, expires_at)
    VALUES (%(queue)s, %(dedup_key)s, nextval(pg_get_serial_sequence('{ITEM}', 'id')),
            now() + make_interval(secs => %(dedup_window)s))
    ON CONFLICT (queue_id, key) DO UPDATE
        SET item_id = EXCLUDED.item_id, expires_at = EXCLUDED.expires_at
        WHERE c.expires_at <= now()
    RETURNING item_id
), ins AS (
    INSERT INTO {ITEM} {_ITEM_COLUMNS}
    SELECT claim.item_id, %(queue)s, %(task)s, %(payload)s::jsonb, 'ready', %(priority)s, {_DUE}, {_DUE}, 0,
           {_MAX_ATTEMPTS}, %(lease_timeout)s, %(dedup_key)s, %(ordering_key)s, {_GROUP_KEY}, '', now(),
           now(){{trace_value}}
    FROM claim
    RETURNING id, run_at, created_at
)
SELECT id, run_at, created_at, pg_notify(%(channel)s, %(queue)s)::text FROM ins
"""
ENQUEUE_DEDUP = _ENQUEUE_DEDUP.format(**_UNTRACED)
ENQUEUE_DEDUP_TRACED = _ENQUEUE_DEDUP.format(**_TRACED)

# Debounce: the enqueues of one key collapse into its one ready item never leased yet (unique index
# item_debounce_ready; an item once leased, running or retrying, keeps its reservation id and absorbs no more), which
# runs once the key has been quiet for `debounce` seconds, or at `debounce_max` seconds after the first of them
# (debounce_until), with the latest payload. Decided by the upsert itself: the first enqueue inserts; each later
# one finds the ready item by the index, waits for its row lock if another enqueuer holds it (two enqueuers at
# once: the second sees the first's row and updates it), replaces its payload, pushes its due time back (never
# past debounce_until) and counts itself in `absorbed`. An item already leased is no longer ready: the next
# enqueue of the key starts a new item (a lease that locked the row first is waited for, then not matched). An
# item of another task holding the key is left alone and nothing is returned (the caller refuses the enqueue).
# NOTIFY on the first enqueue only: the later ones only move a due time back.
_DEBOUNCED_DUE = """LEAST(now() + make_interval(secs => %(debounce)s),
           now() + make_interval(secs => %(debounce_max)s))"""
ENQUEUE_DEBOUNCE = f"""
WITH q AS ({ENSURE_QUEUE}), up AS (
    INSERT INTO {ITEM} AS i {_ITEM_COLUMNS.format(**_UNTRACED)[:-1]}, debounce_key, debounce_until)
    VALUES (DEFAULT, %(queue)s, %(task)s, %(payload)s::jsonb, 'ready', %(priority)s, {_DEBOUNCED_DUE},
            {_DEBOUNCED_DUE}, 0, {_MAX_ATTEMPTS}, %(lease_timeout)s, NULL, %(ordering_key)s, {_GROUP_KEY}, '',
            now(), now(), %(debounce_key)s, now() + make_interval(secs => %(debounce_max)s))
    ON CONFLICT (queue_id, debounce_key) WHERE state = 'ready' AND debounce_key IS NOT NULL AND reservation_id IS NULL
    DO UPDATE SET payload = EXCLUDED.payload, absorbed = i.absorbed + 1, updated_at = now(),
        run_at = LEAST(now() + make_interval(secs => %(debounce)s), i.debounce_until),
        visible_at = LEAST(now() + make_interval(secs => %(debounce)s), i.debounce_until)
    WHERE i.task = EXCLUDED.task
    RETURNING i.id, i.run_at, i.created_at, i.absorbed
)
SELECT id, run_at, created_at, absorbed, CASE WHEN absorbed = 0 THEN pg_notify(%(channel)s, %(queue)s)::text END
FROM up
"""

# Runs as its own statement after ENQUEUE_DEDUP returned nothing, so its snapshot sees the winner's commit.
DEDUP_OWNER = f"""
SELECT c.item_id, i.run_at, i.created_at FROM {DEDUP} c
LEFT JOIN LATERAL (  -- the owner may have finished and been archived inside the window
    SELECT run_at, created_at FROM {ITEM} WHERE id = c.item_id
    UNION ALL
    SELECT run_at, created_at FROM {ITEM_HISTORY} WHERE id = c.item_id
    LIMIT 1
) i ON true
WHERE c.queue_id = %(queue)s AND c.key = %(dedup_key)s
"""

# Bulk enqueue: ids and the transaction's clock first, then COPY the rows. The clock columns are left to their
# defaults (now(), the transaction's start: models.TransactionNow) unless the items are delayed: parsing four
# timestamps per row was a fifth of the server's work of a COPY. The sequence is looked up once
# (a materialized CTE): pg_get_serial_sequence per row was 3 µs of catalog lookups per id, 8x the nextval.
ALLOCATE_IDS = f"""
WITH q AS ({ENSURE_QUEUE}), s AS MATERIALIZED (SELECT pg_get_serial_sequence('{ITEM}', 'id')::regclass AS seq)
SELECT now(), array(SELECT nextval(s.seq) FROM s, generate_series(1, %(n)s)),
       COALESCE((SELECT max_attempts FROM {QUEUE} WHERE name = %(queue)s), %(queue_max_attempts)s),
       {_GROUP_KEY}
"""
_COPY_COLUMNS = (
    "id, queue_id, task, payload, state, priority, attempts, max_attempts, lease_timeout, ordering_key, group_key,"
    " error, trace_context"  # trace_context: \N with tracing off (engine/tracing.py)
)
COPY_ITEMS = f"COPY {ITEM} ({_COPY_COLUMNS}) FROM STDIN"
COPY_DELAYED_ITEMS = f"COPY {ITEM} ({_COPY_COLUMNS}, run_at, visible_at) FROM STDIN"
NOTIFY = "SELECT pg_notify(%(channel)s, %(queue)s)"

# -- lease ----------------------------------------------------------------------------------------------------

# Where a lease draws from. LEASE names its queues (the caller checked them: a concurrency-limited queue under
# its row lock); SETTLE_AND_LEASE picks the leasable ones itself (named or all, not paused, no concurrency limit)
# and reports the limited ones, which the caller then leases one by one under their locks.
_NAMED_QUEUES = "unnest(%(queues)s::text[]) AS q(name)"
_OPEN_QUEUES = f"""(SELECT name FROM {QUEUE}
    WHERE NOT paused AND NOT {_FLOW_CONTROLLED} AND (%(all_queues)s OR name = ANY(%(queues)s))) AS q"""
_LIMITED_QUEUES = f"""SELECT name FROM {QUEUE}
    WHERE NOT paused AND {_FLOW_CONTROLLED} AND (%(all_queues)s OR name = ANY(%(queues)s))"""


# An item `i` with an ordering key is leasable only when no older item of its key is still open (one in flight
# per key, in enqueue order, a retried item keeps blocking its key; see queue_app_ordering_key_free, migration
# 0049). A function, called for an item with a key only, rather than a NOT EXISTS subquery here: PostgreSQL sets a
# subquery's plan up on every execution of the statement, and an item without a key never reaches it (0.1 ms of a
# 0.8 ms lease of one item; a lease of keyed items costs no more). It reads with the lease statement's snapshot.
_ORDERING_KEY_FREE = "(i.ordering_key IS NULL OR queue_app_ordering_key_free(i.queue_id, i.ordering_key, i.id))"


def _picked(queue_source: str, excluded: str) -> str:
    """The lease's choice of rows: due ready items and expired leases of the given queues, best first."""
    return f"""picked AS (
    -- One ordered scan of item_fetch per queue (queue_id = q.name), each stopping after n rows it could lock,
    -- then the best n of those. `queue_id = ANY(array)` cannot walk the index in order (before PostgreSQL 17):
    -- it sorted every due row of the queues on each lease, and its cost estimate switched JIT on.
    SELECT c.* FROM {queue_source}
    CROSS JOIN LATERAL (
        SELECT i.id, i.queue_id, i.task, i.state AS prev_state, i.reservation_id AS prev_reservation, i.attempts,
               i.lease_timeout, i.priority, i.visible_at
        FROM {ITEM} i
        WHERE i.queue_id = q.name
          AND i.state IN ('ready', 'reserved')
          AND i.visible_at <= now()
          AND (i.state = 'ready' OR i.attempts < i.max_attempts){excluded}
          AND {_ORDERING_KEY_FREE}
        ORDER BY i.priority DESC, i.visible_at, i.id
        LIMIT %(n)s
        FOR UPDATE OF i SKIP LOCKED
    ) c
    ORDER BY c.priority DESC, c.visible_at, c.id
    LIMIT %(n)s
)"""


# A term of the item's task (its lease or its floor), NULL when the worker names none for it: the worker's terms
# are three parallel arrays (term_tasks, term_leases, term_floors), looked up by position. Not a CTE over their
# unnest with a subquery per term: those subqueries' plans were set up on every lease (see _ORDERING_KEY_FREE).
_TERM = "(%({array})s::float8[])[array_position(%(term_tasks)s::text[], i.task::text)]"


def _lease_ctes(queue_source: str, excluded: str = "", picked: str | None = None, *, traced: bool = False) -> str:
    """The CTEs of a lease, ending in `leased` (the leased items' rows).

    Due ready items and items whose lease expired (attempts left), from the given queues, best first; an item
    with an ordering key only when no older item of its key is still open (one in flight per key, in enqueue
    order, a retried item keeps blocking its key). SKIP LOCKED lets concurrent leasers pass each other. The
    lease lasts the task's lease when the worker names its tasks' terms (`term_*`: never less than the task's
    floor, its hard timeout plus a margin), else the item's, else the caller's, else the queue's, so a worker
    needs no second round trip to give each item its task's lease. `excluded`: a filter keeping out rows the
    same statement settles (one statement must not update a row twice; only a reserved row can be one, so a
    ready row does not walk the settled ids). `picked`: CTEs of another choice of rows (the fair lease's),
    ending in one named picked with the same columns. `traced`: `leased` also returns the item's trace context
    and its workflow step (the traced statements: _LEASED_COLUMNS_TRACED).
    """
    traced_columns = "              , i.trace_context, i.workflow_step_id\n" if traced else ""
    return f"""{picked or _picked(queue_source, excluded)}, expired AS (
    UPDATE {RESERVATION} r SET outcome = 'expired', finished_at = now()
    FROM picked p
    WHERE p.prev_state = 'reserved' AND r.id = p.prev_reservation AND r.outcome IS NULL
), leased AS (
    -- The picked rows by primary key alone, no join: a join to a CTE is planned on a guessed row count, and a
    -- guess of one row for 5,000 made each probe walk the whole id array (1.8 s). Everything the row needs is
    -- on the row itself: its next attempt, its task's lease (from the terms), a new reservation id.
    UPDATE {ITEM} i
    SET state = 'reserved', reservation_id = nextval('{RESERVATION_SEQUENCE}'), attempts = i.attempts + 1,
        visible_at = now() + make_interval(secs => GREATEST(COALESCE(
            {_TERM.format(array="term_leases")}, i.lease_timeout, %(lease_timeout)s,
            (SELECT q.lease_timeout FROM {QUEUE} q WHERE q.name = i.queue_id)
        ), COALESCE({_TERM.format(array="term_floors")}, 0))),
        updated_at = now()
    WHERE i.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING i.reservation_id, i.id AS item_id, i.queue_id, i.task, i.payload, i.attempts AS attempt,
              i.max_attempts, i.visible_at AS lease_expires_at, i.priority, i.ordering_key, i.run_at, i.created_at
{traced_columns}), res AS (
    INSERT INTO {RESERVATION}
        (id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at, error, traceback)
    SELECT reservation_id, item_id, attempt, %(worker_id)s, now(), lease_expires_at, now(), '', '' FROM leased
)"""


_LEASED_COLUMNS = """reservation_id, item_id, queue_id, task, payload, attempt, max_attempts, lease_expires_at,
       priority,
       ordering_key, run_at, created_at"""

LEASE = f"""
WITH {_lease_ctes(_NAMED_QUEUES)}
SELECT {_LEASED_COLUMNS} FROM leased
"""

# With tracing on (engine/tracing.py), and with JSON logs (worker/leasing.py), the worker's lease statements are
# the `_TRACED` variants: their rows end in the item's stored trace context and, for a workflow step's item, its
# workflow's id and the step's name (for its log lines, logcontext.py): read from the row the lease updates anyway,
# and the step by its primary key only when the item is one. No second round trip per batch for the contexts.
# Without either the statements above stay as they are (their plans, and the SQL API's jobsite_lease that binds
# LEASE).
_LEASED_COLUMNS_TRACED = f"""{_LEASED_COLUMNS}, trace_context,
       CASE WHEN workflow_step_id IS NOT NULL
            THEN (SELECT s.workflow_id FROM {WORKFLOW_STEP} s WHERE s.id = workflow_step_id) END,
       CASE WHEN workflow_step_id IS NOT NULL
            THEN (SELECT s.name FROM {WORKFLOW_STEP} s WHERE s.id = workflow_step_id) END"""
LEASE_TRACED = f"""
WITH {_lease_ctes(_NAMED_QUEUES, traced=True)}
SELECT {_LEASED_COLUMNS_TRACED} FROM leased
"""

# The fair lease of one queue, run under its row lock (LOCK_FLOW_QUEUE), so no other leaser of the queue runs
# at the same time: group keys take turns. Its group keys are found by skipping through item_group (one probe
# per key). Each key may take its room (the batch, less for a key at its group limit: `group_limit` minus the
# key's items in flight). Candidates: each key's lane read in the fetch order up to twice its share of the batch
# (its weight over all keys' weights), so a lease reads about two batches of rows however many keys there are;
# plus the queue's best `n` rows in the fetch order (item_fetch), so a key with more high-priority items than its
# share still has them all in the running. The batch takes the keys' first candidates, then their seconds, and
# so on: priority first, then the turn (divided by the key's weight: a key of weight 3 has three turns to another
# key's one), then due time. So a key with 100,000 items and a key with 10 both progress at each lease, and `n`
# items of a higher priority always go before any of a lower one. The chosen rows are then locked by primary
# key (SKIP LOCKED, the lease's conditions checked again on the row's latest version): a row cancelled or
# requeued meanwhile is left out, never taken twice.
_FAIR_DUE = f"""i.state IN ('ready', 'reserved')
          AND i.visible_at <= now()
          AND (i.state = 'ready' OR i.attempts < i.max_attempts)
          AND {_ORDERING_KEY_FREE}"""
_FAIR_PICKED = f"""keys(group_key) AS (
    (SELECT i.group_key FROM {ITEM} i
     WHERE i.queue_id = %(queue)s AND i.state IN ('ready', 'reserved') AND i.group_key IS NOT NULL
     ORDER BY i.group_key LIMIT 1)
    UNION ALL
    SELECT (SELECT i.group_key FROM {ITEM} i
            WHERE i.queue_id = %(queue)s AND i.state IN ('ready', 'reserved') AND i.group_key IS NOT NULL
              AND i.group_key > k.group_key
            ORDER BY i.group_key LIMIT 1)
    FROM keys k WHERE k.group_key IS NOT NULL
), flight AS MATERIALIZED (
    -- Once, from item_in_flight (the queue's few rows in flight), not per key down its lane (all its items).
    -- (no `group_key IS NOT NULL` here: it would let the planner walk item_group, every open item of the queue)
    SELECT i.group_key, count(*) AS n FROM {ITEM} i
    WHERE i.queue_id = %(queue)s AND i.state = 'reserved' AND i.visible_at > now()
    GROUP BY i.group_key
), shares AS MATERIALIZED (
    SELECT k.group_key,
           COALESCE((SELECT w.weight FROM unnest(%(weight_keys)s::text[], %(weight_values)s::float8[])
                         AS w(group_key, weight) WHERE w.group_key = k.group_key), 1) AS weight,
           GREATEST(0, LEAST(%(n)s, %(group_limit)s::int
                                    - COALESCE((SELECT f.n FROM flight f WHERE f.group_key = k.group_key), 0)))
               AS room
    FROM keys k WHERE k.group_key IS NOT NULL
), candidates AS (
    SELECT c.* FROM shares s
    CROSS JOIN LATERAL (
        SELECT i.id, i.group_key, i.priority, i.visible_at
        FROM {ITEM} i
        WHERE i.queue_id = %(queue)s AND i.group_key = s.group_key
          AND {_FAIR_DUE}
        ORDER BY i.priority DESC, i.visible_at, i.id
        LIMIT LEAST(s.room, ceil(2.0 * %(n)s * s.weight / (SELECT sum(weight) FROM shares))::int)
    ) c
    UNION
    (SELECT i.id, i.group_key, i.priority, i.visible_at
     FROM {ITEM} i
     WHERE i.queue_id = %(queue)s
       AND {_FAIR_DUE}
     ORDER BY i.priority DESC, i.visible_at, i.id
     LIMIT %(n)s)
), turns AS (
    SELECT c.id, c.priority, c.visible_at, s.room, s.weight,
           row_number() OVER (PARTITION BY c.group_key ORDER BY c.priority DESC, c.visible_at, c.id) AS nth
    FROM candidates c JOIN shares s ON s.group_key = c.group_key
), chosen AS (
    SELECT id FROM turns WHERE nth <= room ORDER BY priority DESC, nth / weight, visible_at, id LIMIT %(n)s
), picked AS (
    SELECT i.id, i.queue_id, i.task, i.state AS prev_state, i.reservation_id AS prev_reservation, i.attempts,
           i.lease_timeout, i.priority, i.visible_at
    FROM {ITEM} i
    WHERE i.id = ANY(ARRAY(SELECT id FROM chosen))
      AND (i.state || '') IN ('ready', 'reserved')  -- an expression: see _state_is
      AND i.visible_at <= now()
      AND (i.state = 'ready' OR i.attempts < i.max_attempts)
    FOR UPDATE OF i SKIP LOCKED
)"""

# Priority aging (a queue's aging_rate, run under its row lock like the flow-controlled leases): an item due for
# `age` seconds counts as priority + aging_rate * age, which orders the items as their due time less
# priority / aging_rate does (the same for every item at any moment, so a key fixed per item: no item's place
# changes while it waits). Candidates: the queue's priority levels, found by skipping through item_fetch (one
# probe each, at most 201), and each level's first `n` due rows in its index order (due time, id), cut at a
# bound: the top level's `n`-th aged key (`bound`; when it has `n` due rows, no row of any level with a larger
# key can be among the best `n`), so a lower level is read only as far as its rows can compete (a level 5
# points down at 1 point/s: rows due 5 s before that key). The best `n` candidates by the aged key are then locked
# by primary key (SKIP LOCKED, the conditions checked again). Ordering keys hold as in every lease; concurrency
# and rate limits hold through the row lock and the room it gives.
_AGED_PICKED = f"""levels(priority) AS (
    (SELECT i.priority FROM {ITEM} i
     WHERE i.queue_id = %(queue)s AND i.state IN ('ready', 'reserved')
     ORDER BY i.priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT i.priority FROM {ITEM} i
            WHERE i.queue_id = %(queue)s AND i.state IN ('ready', 'reserved') AND i.priority < l.priority
            ORDER BY i.priority DESC LIMIT 1)
    FROM levels l WHERE l.priority IS NOT NULL
), top AS MATERIALIZED (
    SELECT i.visible_at - make_interval(secs => i.priority / %(aging_rate)s::float8) AS aged
    FROM {ITEM} i
    WHERE i.queue_id = %(queue)s
      AND i.priority = (SELECT max(l.priority) FROM levels l)
      AND {_FAIR_DUE}
    ORDER BY i.priority DESC, i.visible_at, i.id
    LIMIT %(n)s
), bound AS MATERIALIZED (
    SELECT CASE WHEN count(*) >= %(n)s THEN max(aged) END AS aged FROM top
), candidates AS (
    SELECT c.* FROM levels l
    CROSS JOIN bound b
    CROSS JOIN LATERAL (
        SELECT i.id, i.priority, i.visible_at
        FROM {ITEM} i
        WHERE i.queue_id = %(queue)s AND i.priority = l.priority
          AND {_FAIR_DUE}
          AND (b.aged IS NULL OR i.visible_at <= b.aged + make_interval(secs => l.priority / %(aging_rate)s::float8))
        ORDER BY i.priority DESC, i.visible_at, i.id
        LIMIT %(n)s
    ) c
    WHERE l.priority IS NOT NULL
), chosen AS (
    SELECT id FROM candidates
    ORDER BY visible_at - make_interval(secs => priority / %(aging_rate)s::float8), id
    LIMIT %(n)s
), picked AS (
    SELECT i.id, i.queue_id, i.task, i.state AS prev_state, i.reservation_id AS prev_reservation, i.attempts,
           i.lease_timeout, i.priority, i.visible_at
    FROM {ITEM} i
    WHERE i.id = ANY(ARRAY(SELECT id FROM chosen))
      AND (i.state || '') IN ('ready', 'reserved')  -- an expression: see _state_is
      AND i.visible_at <= now()
      AND (i.state = 'ready' OR i.attempts < i.max_attempts)
    FOR UPDATE OF i SKIP LOCKED
)"""

LEASE_AGED = f"""
WITH RECURSIVE {_lease_ctes("", picked=_AGED_PICKED)}
SELECT {_LEASED_COLUMNS} FROM leased
"""
LEASE_AGED_TRACED = f"""
WITH RECURSIVE {_lease_ctes("", picked=_AGED_PICKED, traced=True)}
SELECT {_LEASED_COLUMNS_TRACED} FROM leased
"""

LEASE_FAIR = f"""
WITH RECURSIVE {_lease_ctes("", picked=_FAIR_PICKED)}
SELECT {_LEASED_COLUMNS} FROM leased
"""
LEASE_FAIR_TRACED = f"""
WITH RECURSIVE {_lease_ctes("", picked=_FAIR_PICKED, traced=True)}
SELECT {_LEASED_COLUMNS_TRACED} FROM leased
"""

# Whether any item of the given queues (named or all; not paused) is ready now, leasable or held back: by an
# ordering key whose older items are in flight or ready (a lease does not see a key its own settle freed: the
# next item of the key is leasable from the next statement on), by a rate, concurrency or group limit. A
# `--burst` worker stops only when this is false and nothing is in flight. Not ready: items
# delayed or backing off before a retry (visible later), items behind such an item of their key, paused queues.
# Probes item_fetch per queue from its best row, and item_ordering_open per keyed item it passes.
READY_EXISTS = f"""
SELECT EXISTS (
    SELECT 1 FROM {QUEUE} q
    CROSS JOIN LATERAL (
        SELECT 1 FROM {ITEM} i
        WHERE i.queue_id = q.name
          AND i.state IN ('ready', 'reserved')
          AND i.visible_at <= now()
          AND (i.state = 'ready' OR i.attempts < i.max_attempts)
          AND (i.ordering_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM {ITEM} o
                WHERE o.queue_id = i.queue_id AND o.ordering_key = i.ordering_key
                  AND o.state IN ('ready', 'reserved') AND o.id < i.id  -- item_ordering_open's predicate
                  AND o.state = 'ready' AND o.visible_at > now()))
        LIMIT 1
    ) c
    WHERE NOT q.paused AND (%(all_queues)s OR q.name = ANY(%(queues)s))
)"""


# The items a settle names, as its first CTE `v`: a batch's three arrays, or one item's three values. One item
# is written apart so that its plan is planned once: a project's connection (a transactional handler's
# complete, a reservation used as a lock, a webhook's delivery) keeps PostgreSQL's plan choice, which keeps the
# generic plan only when it does not look dearer than planning anew, and an array of unknown length is
# estimated at 10 rows, ten times the one row each call names. So a complete through the arrays was planned
# on every call, 0.27 ms of 0.83.
_MANY_SETTLED = """SELECT * FROM unnest(%(item_ids)s::bigint[], %(reservation_ids)s::bigint[], %(results)s::jsonb[])
        AS v(item_id, reservation_id, result)"""
_ONE_SETTLED = """SELECT %(item_id)s::bigint AS item_id, %(reservation_id)s::bigint AS reservation_id,
           %(result)s::jsonb AS result"""


# Complete items: fenced on the reservation, done with their results. Shared by COMPLETE_MANY, COMPLETE_ONE and
# SETTLE_AND_LEASE; `settled_reservations` returns the reservation of each item it completed, `already` each
# one this very reservation had completed before: a complete retried after its reply was lost (a connection cut
# after the commit) succeeded, and must not be taken for stale (an at-most-once item would then never run).
def _complete_ctes(settled_items: str) -> str:
    return f"""v AS (
    {settled_items}
), settled AS (
    -- Driven from v: one primary-key probe per completed item. A second way in (`i.id = ANY(item_ids)`) let
    -- the generic plan take the items first and scan v once per item (it guesses 10 rows for either side):
    -- 1,000,000 join-filter rows, 174 ms, for a batch of 1,000.
    UPDATE {ITEM} i
    SET state = 'done', result = v.result, error = '', finished_at = now(), updated_at = now()
    FROM v
    WHERE i.id = v.item_id AND i.reservation_id = v.reservation_id AND {_state_is("reserved", "i")}
    RETURNING i.reservation_id
), already AS (
    -- Only the completes `settled` did not take are looked up (usually none: no second probe per item). Every
    -- part of the statement reads one snapshot, taken before its updates: an item done here is not done here.
    SELECT i.reservation_id FROM v JOIN {ITEM} i ON i.id = v.item_id AND i.reservation_id = v.reservation_id
    WHERE v.reservation_id NOT IN (SELECT reservation_id FROM settled) AND {_state_is("done", "i")}
), settled_reservations AS (
    -- A HOT update: no index names outcome or finished_at (see models.Reservation.not_done_at).
    UPDATE {RESERVATION} r SET outcome = 'done', finished_at = now()
    FROM settled s WHERE r.id = s.reservation_id
    RETURNING r.id
)"""


_COMPLETE_CTES = _complete_ctes(_MANY_SETTLED)


# -- settle and lease in one round trip -----------------------------------------------------------------------


# What a worker does between batches: complete the items whose handlers returned, and lease the next batch, in
# one statement (one round trip, one commit). All parts see one snapshot: an ordering key freed by a completion
# here is leasable from the next lease on. The first row (kind 'm') carries the reservations whose complete was
# stale (not current any more: nothing changed) and the leasable queues with a concurrency limit; each further
# row (kind 'l') is one leased item.
#
# `relaxed_commit` (the statement is a transaction of its own, the worker's case): its commit does not wait for
# the WAL flush (synchronous_commit off for this transaction only; the WAL writer flushes it within ~0.6 s).
# A crash of the server in that window loses only leases and at-least-once completes, and either loss means a
# re-run, which at-least-once allows. Commits that must survive a crash stay synchronous, and flushing the WAL
# up to their own record flushes every earlier relaxed one: the at-most-once start before a run
# (COMPLETE_MANY), a transactional handler's settle, fails and dead letters. Inside a caller's transaction the
# setting is left alone (it would apply to the caller's whole transaction).
#
# With nothing to settle (an idle worker's lease of a lone item, the latency path) the worker sends LEASE_OPEN:
# the same statement without the complete's CTEs. Empty, they still cost their part of every execution: two
# updates' executor set-up, the unnest and the stale reservations' subquery, 0.14 ms of a 0.84 ms lease of one
# item on an idle machine (docs/benchmarks.md). Its 'm' row names no stale reservation.
def _settle_and_lease(traced: bool, settles: bool = True) -> str:
    traced_nulls = ", NULL::text, NULL::bigint, NULL::varchar" if traced else ""
    if settles:
        excluded = " AND (i.state = 'ready' OR i.id <> ALL(%(item_ids)s::bigint[]))"
        complete = f"{_COMPLETE_CTES},\n"
        stale = """array(SELECT v.reservation_id FROM v
                  WHERE v.reservation_id NOT IN (SELECT * FROM settled UNION ALL SELECT * FROM already))"""
    else:
        excluded, complete, stale = "", "", "ARRAY[]::bigint[]"
    return f"""
WITH {complete}{_lease_ctes(_OPEN_QUEUES, excluded=excluded, traced=traced)},
commit_mode AS (SELECT set_config('synchronous_commit', 'off', true) WHERE %(relaxed_commit)s)
SELECT 'm', {stale},
       array({_LIMITED_QUEUES}),
       NULL::bigint, NULL::bigint, NULL::varchar, NULL::varchar, NULL::jsonb, NULL::int, NULL::int,
       NULL::timestamptz, NULL::smallint, NULL::varchar, NULL::timestamptz, NULL::timestamptz{traced_nulls}
FROM (SELECT count(*) FROM commit_mode) AS set_commit_mode  -- evaluated once, with the 'm' row
UNION ALL
SELECT 'l', NULL, NULL, {_LEASED_COLUMNS_TRACED if traced else _LEASED_COLUMNS} FROM leased
"""


SETTLE_AND_LEASE = _settle_and_lease(traced=False)
SETTLE_AND_LEASE_TRACED = _settle_and_lease(traced=True)  # tracing on: see _LEASED_COLUMNS_TRACED
LEASE_OPEN = _settle_and_lease(traced=False, settles=False)
LEASE_OPEN_TRACED = _settle_and_lease(traced=True, settles=False)

# -- settle ---------------------------------------------------------------------------------------------------

_COMPLETED = "SELECT id FROM settled_reservations UNION ALL SELECT * FROM already"
COMPLETE_MANY = f"WITH {_COMPLETE_CTES} {_COMPLETED}"
COMPLETE_ONE = f"WITH {_complete_ctes(_ONE_SETTLED)} {_COMPLETED}"

# At-most-once: record, durably and fenced, that the handlers of these reservations are about to start. The item
# stays reserved (its lease is renewed while the handler runs, and it is settled done or dead after), but its
# attempts are spent (max_attempts = attempts: no lease takes it again), and its reservation says it started:
# should the lease lapse (the worker died mid-handler), the rescue makes it a dead letter that says so. A lease
# already past its deadline is not started (its worker may have been away; another may be rescuing it).
# Returns the reservations started; one missing was stale: its handler must not run.
START_AT_MOST_ONCE = f"""
WITH v AS (
    SELECT * FROM unnest(%(item_ids)s::bigint[], %(reservation_ids)s::bigint[]) AS v(item_id, reservation_id)
), started AS (
    UPDATE {ITEM} i SET max_attempts = i.attempts, updated_at = now()
    FROM v
    WHERE i.id = v.item_id AND i.reservation_id = v.reservation_id AND {_state_is("reserved", "i")}
      AND i.visible_at > now()
    RETURNING i.reservation_id
)
UPDATE {RESERVATION} r SET started_at = now() FROM started s WHERE r.id = s.reservation_id
RETURNING r.id
"""

# Fail one attempt: back to ready after `retry_in` seconds while attempts are left, otherwise dead with a
# DeadLetter row. `force_dead` sends it straight to the dead letters (poison: unknown task, bad payload).
# `outcome` names how the attempt ended when it is not a plain failure (timed_out).
FAIL = f"""
WITH cur AS (
    SELECT id, reservation_id, (attempts >= max_attempts OR %(force_dead)s) AS dies
    FROM {ITEM}
    WHERE id = %(item_id)s AND reservation_id = %(reservation_id)s AND {_state_is("reserved")}
    FOR UPDATE
), settled AS (
    UPDATE {ITEM} i
    SET state = CASE WHEN cur.dies THEN 'dead' ELSE 'ready' END,
        run_at = CASE WHEN cur.dies THEN i.run_at ELSE now() + make_interval(secs => %(retry_in)s) END,
        visible_at = CASE WHEN cur.dies THEN i.visible_at ELSE now() + make_interval(secs => %(retry_in)s) END,
        finished_at = CASE WHEN cur.dies THEN now() END,
        error = %(error)s, updated_at = now()
    FROM cur
    WHERE i.id = cur.id
    RETURNING i.id, i.reservation_id, cur.dies
), letter AS (
    INSERT INTO {DEAD_LETTER} (item_id, reason, last_error, died_at, requeued_by)
    SELECT id, CASE WHEN %(force_dead)s THEN %(reason)s ELSE 'max attempts exhausted' END, %(error)s, now(), ''
    FROM settled WHERE dies
)
UPDATE {RESERVATION} r
SET outcome = COALESCE(%(outcome)s, CASE WHEN s.dies THEN 'dead' ELSE 'retry' END),
    finished_at = now(), error = %(error)s, traceback = %(traceback)s
FROM settled s WHERE r.id = s.reservation_id
RETURNING r.id, s.dies
"""


# Extend leases (a heartbeat, a handler's ctx.extend, a reservation used as a lock): a batch's arrays, or one
# item's values (EXTEND_ONE: planned once on a project's connection, as COMPLETE_ONE).
def _extend(extended_items: str) -> str:
    return f"""
WITH v AS (
    {extended_items}
), ext AS (
    UPDATE {ITEM} i SET visible_at = now() + make_interval(secs => %(seconds)s), updated_at = now()
    FROM v
    WHERE i.id = v.item_id AND i.reservation_id = v.reservation_id AND {_state_is("reserved", "i")}
    RETURNING i.reservation_id, i.visible_at
)
UPDATE {RESERVATION} r SET lease_expires_at = ext.visible_at, heartbeat_at = now()
FROM ext WHERE r.id = ext.reservation_id
RETURNING r.id, r.lease_expires_at
"""


EXTEND_MANY = _extend(
    "SELECT * FROM unnest(%(item_ids)s::bigint[], %(reservation_ids)s::bigint[]) AS v(item_id, reservation_id)"
)
EXTEND_ONE = _extend("SELECT %(item_id)s::bigint AS item_id, %(reservation_id)s::bigint AS reservation_id")

# Hand an item back without spending its attempt (worker shutting down before it started the handler).
RELEASE = f"""
WITH settled AS (
    UPDATE {ITEM}
    SET state = 'ready', attempts = attempts - 1, visible_at = now() + make_interval(secs => %(delay)s),
        updated_at = now()
    WHERE id = %(item_id)s AND reservation_id = %(reservation_id)s AND {_state_is("reserved")}
    RETURNING reservation_id
)
UPDATE {RESERVATION} r SET outcome = 'released', finished_at = now()
FROM settled s WHERE r.id = s.reservation_id
RETURNING r.id
"""

# -- maintenance ----------------------------------------------------------------------------------------------


# The dead letter of an at-most-once item whose worker stopped while its handler ran (its lease lapsed after
# START_AT_MOST_ONCE): it may have run partly, and is never run again.
class DeadReason:
    """Texts the rescue writes (a class, not module constants: every upper-case string here is a statement)."""

    AT_MOST_ONCE_STOPPED = "worker stopped during an at-most-once run; not retried"
    AT_MOST_ONCE_STOPPED_ERROR = (
        "the worker stopped (killed, out of memory, host lost or frozen past its lease) while the handler of this "
        "at-most-once item ran; it may have run partly and is not run again"
    )


# Expired leases: back to ready (attempt already counted at lease, due as of its run_at) or, with no attempts
# left, dead. An
# at-most-once item whose handler had started (its reservation's started_at) is a dead letter whatever its
# attempts: AT_MOST_ONCE_STOPPED. A lease
# held by a worker that stopped heartbeating (`lost_after` seconds) counts as expired too: a killed worker's
# long leases (Spark runs, hour-long hard timeouts) come back in about a minute instead of at their deadline.
# Only rows in flight are read (partial index item_in_flight), each joined by primary key.
RESCUE_EXPIRED = f"""
WITH cur AS (
    SELECT i.id, i.reservation_id, i.attempts >= i.max_attempts OR r.started_at IS NOT NULL AS dies,
           r.started_at IS NOT NULL AS mid_run
    FROM {ITEM} i
    LEFT JOIN {RESERVATION} r ON r.id = i.reservation_id
    LEFT JOIN queue_app_worker w ON w.id = r.worker_id
    WHERE i.state = 'reserved'
      AND (i.visible_at < now()
           OR w.last_heartbeat < now() - make_interval(secs => %(lost_after)s))
    ORDER BY i.visible_at
    LIMIT %(limit)s
    FOR UPDATE OF i SKIP LOCKED
), settled AS (
    UPDATE {ITEM} i
    SET state = CASE WHEN cur.dies THEN 'dead' ELSE 'ready' END,
        -- Back in line where it stood: due since its run_at (its first due time, or its retry's), so it is
        -- leased again ahead of every item that became due after it, not behind the backlog that built up
        -- while its lease ran (measured before: 18 s under a backlog).
        visible_at = LEAST(i.run_at, now()),
        finished_at = CASE WHEN cur.dies THEN now() END,
        error = CASE WHEN cur.mid_run THEN '{DeadReason.AT_MOST_ONCE_STOPPED_ERROR}'
                     ELSE 'lease expired: the worker holding it stopped or hung' END,
        updated_at = now()
    FROM cur WHERE i.id = cur.id
    RETURNING i.id, i.reservation_id, cur.dies, cur.mid_run, i.error
), letter AS (
    INSERT INTO {DEAD_LETTER} (item_id, reason, last_error, died_at, requeued_by)
    SELECT id, CASE WHEN mid_run THEN '{DeadReason.AT_MOST_ONCE_STOPPED}' ELSE 'lease expired on the last attempt' END,
           error, now(), ''
    FROM settled WHERE dies
), outcome AS (
    UPDATE {RESERVATION} r SET outcome = 'expired', finished_at = now(),
        error = CASE WHEN s.mid_run THEN s.error ELSE r.error END
    FROM settled s WHERE r.id = s.reservation_id AND r.outcome IS NULL
)
SELECT count(*) FILTER (WHERE NOT dies), count(*) FILTER (WHERE dies) FROM settled
"""

PRUNE_DONE = f"""
DELETE FROM {ITEM} WHERE id IN (
    SELECT i.id FROM {ITEM} i JOIN {QUEUE} q ON q.name = i.queue_id
    WHERE i.state = 'done' AND i.finished_at < now() - q.retention
    LIMIT %(limit)s
)
"""

# -- history: finished rows out of the hot tables (engine/history.py) ----------------------------------------

# Every column of an item and of a reservation, as the move copies them (tests/core/in_process/test_history.py checks
# that these name every column of the hot tables, so a column added later is not silently dropped by the move).
ITEM_FIELDS = (
    *("id", "queue_id", "task", "payload", "state", "priority", "run_at", "visible_at", "attempts", "max_attempts"),
    *("lease_timeout", "dedup_key", "ordering_key", "group_key", "reservation_id", "result", "error"),
    *("workflow_step_id", "created_at", "updated_at", "finished_at", "trace_context", "debounce_key", "debounce_until"),
    *("absorbed",),
)
RESERVATION_FIELDS = (
    *("id", "item_id", "attempt", "worker_id", "reserved_at", "lease_expires_at", "heartbeat_at", "finished_at"),
    *("started_at", "outcome", "error", "traceback"),
)
_ITEM_LIST = ", ".join(ITEM_FIELDS)
_RESERVATION_LIST = ", ".join(RESERVATION_FIELDS)


def _columns_of(alias: str, fields: tuple[str, ...]) -> str:
    return ", ".join(f"{alias}.{c}" for c in fields)


# The archiver's batch: done and cancelled items finished more than %(grace)s seconds ago, locked so no requeue
# or second archiver moves them meanwhile, with the UTC day each belongs to. Items with a dead letter stay: the
# letter's foreign key (ON DELETE CASCADE) holds them in the hot table, with the dead ones.
ARCHIVE_PICK = f"""
SELECT i.id, (i.finished_at AT TIME ZONE 'UTC')::date FROM {ITEM} i
WHERE i.state IN ('done', 'cancelled') AND i.finished_at < now() - make_interval(secs => %(grace)s)
  AND NOT EXISTS (SELECT 1 FROM {DEAD_LETTER} d WHERE d.item_id = i.id)
LIMIT %(limit)s
FOR UPDATE OF i SKIP LOCKED
"""
ENSURE_PARTITIONS = "SELECT count(*) FILTER (WHERE queue_app_history_partition(d)) FROM unnest(%(days)s::date[]) d"
# Items and their reservations out of the hot tables and into history, ids kept, in one statement (one
# snapshot: no reader of queue_app_item_all sees a row twice or not at all). The reservations' delete comes
# first in the statement, so the item delete's cascade trigger (migration 0007) finds nothing left to delete.
ARCHIVE_MOVE = f"""
WITH res AS (
    DELETE FROM {RESERVATION} r WHERE r.item_id = ANY(%(ids)s::bigint[])
    RETURNING {_columns_of("r", RESERVATION_FIELDS)}, r.not_done_at
), items AS (
    DELETE FROM {ITEM} i WHERE i.id = ANY(%(ids)s::bigint[])
    RETURNING {_columns_of("i", ITEM_FIELDS)}
), res_moved AS (
    INSERT INTO {RESERVATION_HISTORY} ({_RESERVATION_LIST}, not_done_at, item_finished_at)
    SELECT res.*, items.finished_at FROM res JOIN items ON items.id = res.item_id
)
INSERT INTO {ITEM_HISTORY} ({_ITEM_LIST}) SELECT * FROM items
"""
# A requeue of archived items: back into the hot tables with their reservations (ids kept), still finished; the
# requeue then makes them ready as it does any dead or cancelled item.
RESTORE_ITEMS = f"""
WITH items AS (
    DELETE FROM {ITEM_HISTORY} h WHERE h.id = ANY(%(ids)s::bigint[]) AND h.state IN ('dead', 'cancelled')
    RETURNING {_columns_of("h", ITEM_FIELDS)}
), res AS (
    DELETE FROM {RESERVATION_HISTORY} r WHERE r.item_id = ANY(ARRAY(SELECT id FROM items))
    RETURNING {_columns_of("r", RESERVATION_FIELDS)}
), res_back AS (
    INSERT INTO {RESERVATION} ({_RESERVATION_LIST}) SELECT * FROM res
)
INSERT INTO {ITEM} ({_ITEM_LIST}) SELECT * FROM items RETURNING id
"""
# The history partitions (both tables) and the UTC day each holds, from their names (queue_app_history_partition).
HISTORY_PARTITIONS = f"""
SELECT c.relname, to_date(right(c.relname, 8), 'YYYYMMDD')
FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
WHERE h.inhparent IN ('{ITEM_HISTORY}'::regclass, '{RESERVATION_HISTORY}'::regclass)
ORDER BY 2, 1
"""
# What every queue keeps: the longest retention (whole days older than it are dropped), and the queues keeping
# less, or less than a day, whose older rows are deleted row by row.
RETENTIONS = f"SELECT name, extract(epoch FROM retention) FROM {QUEUE}"
DROP_PARTITION = "DROP TABLE IF EXISTS {table}"
# Both history parents, before a partition's DROP (a DROP locks its parent ACCESS EXCLUSIVE), never waiting for one
# while holding the other: that could close a circle with a reader of the `_all` views (migration 0041).
LOCK_HISTORY_PARENTS = "SELECT queue_app_lock_history()"
# Archived rows of one queue older than its retention (engine/history.py: pruned_by_rows), with their
# reservations: %(limit)s at a time. The reservations' bound on item_finished_at (their item's finished_at)
# leaves out the partitions of newer days.
PRUNE_HISTORY = f"""
WITH gone AS (
    DELETE FROM {ITEM_HISTORY} h WHERE (h.id, h.finished_at) IN (
        SELECT x.id, x.finished_at FROM {ITEM_HISTORY} x
        WHERE x.queue_id = %(queue)s AND x.finished_at < now() - make_interval(secs => %(retention)s)
        LIMIT %(limit)s)
    RETURNING h.id
), res AS (
    DELETE FROM {RESERVATION_HISTORY} r WHERE r.item_id = ANY(ARRAY(SELECT id FROM gone))
        AND r.item_finished_at < now() - make_interval(secs => %(retention)s)
)
SELECT count(*) FROM gone
"""

PRUNE_DEDUP = f"DELETE FROM {DEDUP} WHERE expires_at <= now()"

# The queue's hot tables whose dead rows (every lease, settle and prune leaves some) have piled up past
# `min_dead` and `share` of their live rows: they need a VACUUM. From the statistics collector (track_counts).
# With them the history partitions a row-by-row prune (engine/history.py) has left dead rows in: vacuumed,
# their space is used again and a queue keeping minutes keeps its history at that size. The hand-off's offers
# past `min_dead_offers`: a handful of live rows (one per idle worker), read whole by every enqueue that may
# take one, so their dead rows cost each enqueue, and a VACUUM of them costs a millisecond.
BLOATED_TABLES = f"""
SELECT relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables
WHERE schemaname = current_schema()
  AND (relname = ANY(%(tables)s)
       OR relid IN (SELECT inhrelid FROM pg_inherits
                    WHERE inhparent IN ('{ITEM_HISTORY}'::regclass, '{RESERVATION_HISTORY}'::regclass)))
  AND n_dead_tup > GREATEST(CASE WHEN relname = '{HANDOFF}' THEN %(min_dead_offers)s ELSE %(min_dead)s END,
                            %(share)s * n_live_tup)
ORDER BY n_dead_tup DESC
"""
# SKIP_LOCKED: a table another VACUUM (autovacuum, another worker) holds is skipped, never waited for. No
# ANALYZE with it: on a queue at 7,000 items/s here the ANALYZE was 0.5-1.0 s of each 0.6-1.1 s VACUUM of the
# item table (sampling 30,000 rows of every column), every 5-10 s, and it took a core from the leases (see
# STALE_STATISTICS for when the hot tables are analyzed).
VACUUM = "VACUUM (SKIP_LOCKED) {table}"

# The hot tables that have outgrown their statistics: more than `growth` times the live rows, or the pages, the
# last ANALYZE (or VACUUM) counted, and by more than `min_rows` rows or `min_pages` pages. The engine's
# generic plans are made on the statistics and the size a table has when a connection first runs a statement:
# made on an empty table (a worker started on an idle queue, or a queue analyzed after it drained), they read
# the table whole for every item of a batch, and stay so until an ANALYZE makes every session plan again. A
# queue filled from empty at 11,000 items/s had settles of 500 items take 1.2-2.7 s until one did (about 5 s).
# The live-row count comes from the statistics collector (at most a second late); the size in pages is current,
# and `min_pages` small (an ANALYZE of a small table is cheap): a table filling from empty is analyzed at a few
# hundred rows and then at each fourfold growth, each time within the analyze unit's interval (0.25 s).
# And a table whose rows have all changed since its last ANALYZE (a queue's rows come and go, its columns'
# statistics with them), once every `every` seconds at most: a VACUUM does not analyze (see VACUUM), and an
# ANALYZE of a busy item table takes a core for most of a second.
# The statistics functions on pg_class directly, not the pg_stat_user_tables view (every counter of every
# table): the analyze unit asks four times a second (0.6 against 1.2-1.6 ms here).
STALE_STATISTICS = """
SELECT c.relname FROM pg_class c
WHERE c.oid = ANY(%(tables)s::regclass[])
  AND (pg_stat_get_live_tuples(c.oid) > %(growth)s * GREATEST(c.reltuples, 0) + %(min_rows)s
       OR pg_relation_size(c.oid) / current_setting('block_size')::int > %(growth)s * c.relpages + %(min_pages)s
       OR (pg_stat_get_mod_since_analyze(c.oid)
               > GREATEST(c.reltuples, pg_stat_get_live_tuples(c.oid), 0) + %(min_rows)s
           AND COALESCE(GREATEST(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid)),
                        '-infinity') < now() - make_interval(secs => %(every)s)))
ORDER BY c.relname
"""
ANALYZE = "ANALYZE (SKIP_LOCKED) {table}"

# -- worker ---------------------------------------------------------------------------------------------------

WORKER = "queue_app_worker"

# Register, heartbeat and mark stopped are one upsert: a worker whose row was swept while it could not reach
# the database puts it back with its next heartbeat.
UPSERT_WORKER = f"""
INSERT INTO {WORKER} AS w (id, host, pid, queues, concurrency, started_at, last_heartbeat, state, stats)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(started_at)s, now(), %(state)s,
        %(stats)s::jsonb)
ON CONFLICT (id) DO UPDATE
    SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues, concurrency = EXCLUDED.concurrency,
        started_at = EXCLUDED.started_at, last_heartbeat = now(), state = EXCLUDED.state, stats = EXCLUDED.stats
"""

# How many more connections this role may open now: the least of the server's room (max_connections, less the
# slots kept for superusers), and for a role that is not one, its own CONNECTION LIMIT and its database's, each
# less the client connections it counts (this one included). A worker checks it at start: each pool thread or
# child holds a connection of its own.
CONNECTION_ROOM = """
WITH client AS (SELECT usename, datname FROM pg_stat_activity WHERE backend_type = 'client backend')
SELECT LEAST(
    current_setting('max_connections')::int - (SELECT count(*) FROM client)::int
        - CASE WHEN r.rolsuper THEN 0 ELSE current_setting('superuser_reserved_connections')::int END,
    CASE WHEN NOT r.rolsuper AND r.rolconnlimit >= 0
         THEN r.rolconnlimit - (SELECT count(*) FROM client WHERE usename = current_user)::int END,
    CASE WHEN NOT r.rolsuper AND d.datconnlimit >= 0
         THEN d.datconnlimit - (SELECT count(*) FROM client WHERE datname = current_database())::int END)
FROM pg_roles r, pg_database d
WHERE r.rolname = current_user AND d.datname = current_database()
"""

# Workers silent for `lost_after` seconds are marked stopped (they died without saying so); rows silent for
# `forget_after` seconds are deleted. Returns (marked stopped, deleted).
SWEEP_WORKERS = f"""
WITH gone AS (
    DELETE FROM {WORKER} WHERE last_heartbeat < now() - make_interval(secs => %(forget_after)s)
    RETURNING id
), lost AS (
    UPDATE {WORKER} SET state = 'stopped'
    WHERE state <> 'stopped' AND last_heartbeat < now() - make_interval(secs => %(lost_after)s)
      AND id NOT IN (SELECT id FROM gone)
    RETURNING id
)
SELECT (SELECT count(*) FROM lost), (SELECT count(*) FROM gone)
"""

# Renew the leases a worker holds: each to now + its task's lease (else the item's, else its queue's), never
# less than the task's floor (hard timeout + margin). `keep_longer` (heartbeats) only ever lengthens a lease, so
# one a handler extended itself stays; without it (right after lease) the task's lease replaces the default,
# and a lease already within `tolerance` seconds of it is left alone: nothing locked or written, so the common
# case costs no commit. Rows locked by someone else are skipped, not waited for: a transactional handler holds
# its item's row lock, and while it does no leaser can take the item (SKIP LOCKED), so its lease needs no
# renewal. Returns every reservation still current, with its new deadline or NULL when not rewritten; a
# reservation missing from the result is stale.
RENEW_LEASES = f"""
WITH v AS (
    SELECT * FROM unnest(%(item_ids)s::bigint[], %(reservation_ids)s::bigint[], %(task_leases)s::float8[],
                         %(min_leases)s::float8[]) AS v(item_id, reservation_id, task_lease, min_lease)
), cur AS (
    SELECT i.id, i.reservation_id, now() + make_interval(secs => GREATEST(
               COALESCE(v.task_lease, i.lease_timeout, q.lease_timeout), v.min_lease)) AS deadline
    FROM {ITEM} i
    JOIN v ON i.id = v.item_id AND i.reservation_id = v.reservation_id
    JOIN {QUEUE} q ON q.name = i.queue_id
    WHERE {_state_is("reserved", "i")}
), mine AS (
    SELECT i.id, cur.deadline FROM {ITEM} i JOIN cur ON i.id = cur.id
    WHERE i.reservation_id = cur.reservation_id AND {_state_is("reserved", "i")}
      AND CASE WHEN %(keep_longer)s THEN cur.deadline > i.visible_at
               ELSE abs(extract(epoch FROM cur.deadline - i.visible_at)) >= %(tolerance)s END
    FOR UPDATE OF i SKIP LOCKED
), ext AS (
    UPDATE {ITEM} i SET visible_at = mine.deadline, updated_at = now()
    FROM mine WHERE i.id = mine.id
    RETURNING i.reservation_id, i.visible_at
), res AS (
    UPDATE {RESERVATION} r SET lease_expires_at = ext.visible_at, heartbeat_at = now()
    FROM ext WHERE r.id = ext.reservation_id
)
SELECT cur.reservation_id, ext.visible_at FROM cur LEFT JOIN ext ON ext.reservation_id = cur.reservation_id
"""

# Transactional delivery: lock the item's row for the handler's transaction, fenced like a settle. While the
# lock is held no leaser or rescuer can take the item (both SKIP LOCKED), so the settle at the end of the same
# transaction cannot find it taken.
LOCK_RESERVED = f"""
SELECT id FROM {ITEM}
WHERE id = %(item_id)s AND reservation_id = %(reservation_id)s AND {_state_is("reserved")}
FOR UPDATE
"""

# Maintenance runs under a transaction-scoped advisory lock, so one worker at a time does each duty. Its
# statements (prune, rescue: LIMIT-by-parameter scans of large tables, run seldom) are planned per call with
# the values at hand: ENGINE_SESSION's generic plans are set back to PostgreSQL's default until the end of the
# transaction.
TRY_MAINTENANCE_LOCK = """SELECT pg_try_advisory_xact_lock(%(namespace)s, hashtext(%(unit)s)),
                                set_config('plan_cache_mode', 'auto', true)"""

# The worker's own connections (its loop, lease and maintenance threads), once when each opens
# (engine.db.tune_connection); no other connection of the project, and none behind a transaction pooler (the
# statements are not prepared there, and a session setting would outlive the transaction). The engine's statements are
# server-side prepared; PostgreSQL's default plan choice (`auto`) plans one anew on each call once a backlog
# makes its generic plan look dearer than a custom one (LIMIT %(n)s is estimated at 10% of the rows): at
# 600,000 queued rows that was 1.2 ms of planning on each 0.4 ms lease. And a generic plan estimated that dear
# turns JIT compilation on (50 ms a lease). The statements are written so their generic plans stay index work
# whatever the estimates (tests/core/in_process/test_engine_plans.py checks each on large tables), so each is planned
# once per connection and never compiled. Only prepared statements are affected by plan_cache_mode; jit = off goes with
# it (the maintenance units' and the loop's other queries are not the analytic kind JIT pays for).
ENGINE_SESSION = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), set_config('jit', 'off', false)"

# -- leader rows (engine/leaders.py) ---------------------------------------------------------------------------
# A duty that spans transactions (the wake-up leader of a queue set, the one VACUUM or ANALYZE of the hot tables
# at a time) is a row naming its holder until `expires_at`, not a session advisory lock: behind a transaction
# pooler a session lock stays with the pooled server connection after its client is gone, and then no worker
# can ever take it again. The holder renews its rows with its heartbeat; a row past its expiry is anyone's.
LEADER = "queue_app_leader"

# Take the duty, or renew it when we hold it already; a row held by another and not expired is left alone
# (ON CONFLICT DO UPDATE re-checks its WHERE on the row's newest version under the row lock: of two workers
# arriving together, one takes it). A row comes back when the duty is ours. A follower asks every poll interval:
# while another holds the duty unexpired (the NOT EXISTS, on the snapshot) nothing is inserted, so its row is
# neither locked nor written.
TAKE_LEADER = f"""
INSERT INTO {LEADER} AS l (duty, holder, taken_at, expires_at)
SELECT %(duty)s::varchar, %(holder)s::varchar, now(), now() + make_interval(secs => %(ttl)s::float8)
WHERE NOT EXISTS (SELECT FROM {LEADER} o
                  WHERE o.duty = %(duty)s::varchar AND o.holder <> %(holder)s::varchar AND o.expires_at >= now())
ON CONFLICT (duty) DO UPDATE
    SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
        taken_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.taken_at ELSE now() END
    WHERE l.holder = EXCLUDED.holder OR l.expires_at < now()
RETURNING l.duty
"""

# The heartbeat: every duty this holder still holds runs on for another `ttl` seconds; the duties returned are
# the ones it holds (one taken over by another since is not among them).
RENEW_LEADERS = f"""
UPDATE {LEADER} SET expires_at = now() + make_interval(secs => %(ttl)s)
WHERE holder = %(holder)s
RETURNING duty
"""

# Hand a duty back (NULL duty: all of the holder's): the next worker to ask takes it at once.
RELEASE_LEADER = f"DELETE FROM {LEADER} WHERE holder = %(holder)s AND (duty = %(duty)s OR %(duty)s IS NULL)"

LEADER_OF = f"SELECT holder, expires_at FROM {LEADER} WHERE duty = %(duty)s"

# -- workflows ------------------------------------------------------------------------------------------------

# The workflow engine's SQL (its functions, triggers and the statements its services run) is in its own home,
# queue_app/workflows/sql.py.

# -- id marks (engine/marks.py) -------------------------------------------------------------------------------

ID_MARK = "queue_app_idmark"
# Two statements, in this order: the sequences first, then the clock. Any row stamped (created_at, reserved_at:
# its transaction's start) after the clock reading began after the sequences were read, so took a higher id.
ID_MARK_READ = f"""
SELECT COALESCE(pg_sequence_last_value('{ITEM_SEQUENCE}'), 0),
       COALESCE(pg_sequence_last_value('{RESERVATION_SEQUENCE}'), 0)
"""
# Several workers each run the unit on their own clock: a mark newer than `spacing` seconds stands for this one.
ID_MARK_INSERT = f"""
INSERT INTO {ID_MARK} (taken_at, item_id, reservation_id)
SELECT clock_timestamp(), %(item)s, %(reservation)s
WHERE NOT EXISTS (SELECT FROM {ID_MARK} WHERE taken_at > clock_timestamp() - make_interval(secs => %(spacing)s))
"""
ID_MARK_PRUNE = f"DELETE FROM {ID_MARK} WHERE taken_at < now() - make_interval(secs => %(keep)s)"
