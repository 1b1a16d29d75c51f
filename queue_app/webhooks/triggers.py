"""Events raised inside the engine's SQL reach the webhooks through database triggers, in the transaction that
raised them, so a crash can neither lose one nor send one for a change that rolled back:

- a dead letter (any path: last attempt failed, poison, lease expired on the last attempt, at-most-once failure)
  -> `item.dead_lettered`, a statement trigger on the dead-letter table;
- a Spark run reaching succeeded, failed, cancelled or timed_out (whichever path ends it) ->
  `spark_run.finished` with its outcome;
- a worker marked stopped by the sweep without its own goodbye -> `worker.lost`;
- an item done or an attempt failed -> `item.done` / `item.failed`, only in the queues an endpoint opts in: the
  row trigger exists only while some enabled endpoint subscribes, and its WHEN clause names those queues, so
  the settle of every other item never calls it (the no-endpoint hot path is untouched).

Each trigger checks that some enabled endpoint subscribes before it writes anything, then queues one
`queue_app.webhook_publish` item per event on the `webhooks` queue; that item's handler fans out to the
subscribers (publish_event). The webhooks queue's own items raise no events (no loops).
"""

from psycopg import sql as pgsql

from ..conf import queue_settings
from ..engine.alias import connection
from ..events import PUBLISH_TASK
from .events import ITEM_EVENTS, WEBHOOK_QUEUE

ITEM_TRIGGER = "webhook_item_events"
# The final states of a Spark run (queue_app/spark/models.py, SPARK_FINAL_STATES), as the trigger on its table reads
# them: the webhooks app does not build on the Spark app (a test holds the two equal).
SPARK_FINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")
SPARK_FINAL = ", ".join(f"'{state}'" for state in SPARK_FINAL_STATES)

_QUEUE_PUBLISH_ITEMS = """
    INSERT INTO queue_app_queue (name, paused, concurrency_limit, lease_timeout, max_attempts, retention,
                                 created_at)
    VALUES ('{queue}', false, NULL, 60, 5, interval '7 days', now()) ON CONFLICT (name) DO NOTHING;
    INSERT INTO queue_app_queueitem (queue_id, task, payload, state, priority, run_at, visible_at, attempts,
                                     max_attempts, error, created_at, updated_at)
    SELECT '{queue}', '{task}', jsonb_build_object('type', e.type, 'data', e.data), 'ready', 0, now(), now(), 0,
           5, '', now(), now()
    FROM ({events}) AS e(type, data);
    IF FOUND THEN PERFORM pg_notify('{channel}', '{queue}'); END IF;
"""


def _subscribed(event_types: str) -> str:
    return f"""IF NOT EXISTS (SELECT 1 FROM queue_app_webhookendpoint
                   WHERE enabled AND event_types ?| ARRAY[{event_types}]) THEN RETURN NULL; END IF;"""


def _function(name: str, event_types: str, events: str) -> str:
    body = _QUEUE_PUBLISH_ITEMS.format(
        queue=WEBHOOK_QUEUE, task=PUBLISH_TASK, events=events, channel=queue_settings.NOTIFY_CHANNEL
    )
    return f"""CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {_subscribed(event_types)}
    {body}
    RETURN NULL;
END $$;"""


def create_sql() -> list[str]:
    """The functions and the fixed triggers (migration 0013_webhooks runs these; the NOTIFY channel is the
    setting's)."""
    dead_letters = _function(
        "queue_app_webhook_dead_letters",
        "'item.dead_lettered'",
        f"""SELECT 'item.dead_lettered', jsonb_build_object(
                'item_id', i.id, 'queue', i.queue_id, 'task', i.task, 'attempts', i.attempts,
                'reason', n.reason, 'error', left(n.last_error, 2000), 'died_at', n.died_at)
            FROM new_letters n JOIN queue_app_queueitem i ON i.id = n.item_id
            WHERE i.queue_id <> '{WEBHOOK_QUEUE}'""",
    )
    worker_lost = _function(
        "queue_app_webhook_worker_lost",
        "'worker.lost'",
        """SELECT 'worker.lost', jsonb_build_object(
                'worker_id', NEW.id, 'host', NEW.host, 'pid', NEW.pid, 'queues', NEW.queues,
                'last_heartbeat', NEW.last_heartbeat)""",
    )
    item_events = _function(
        "queue_app_webhook_item_event",
        ", ".join(f"'{t}'" for t in ITEM_EVENTS),
        """SELECT CASE WHEN NEW.state = 'done' THEN 'item.done' ELSE 'item.failed' END, jsonb_build_object(
                'item_id', NEW.id, 'queue', NEW.queue_id, 'task', NEW.task, 'state', NEW.state,
                'attempt', NEW.attempts, 'max_attempts', NEW.max_attempts, 'error', left(NEW.error, 2000),
                'result', CASE WHEN NEW.state = 'done' THEN NEW.result END)""",
    )
    spark_finished = _function(
        "queue_app_webhook_spark_finished",
        "'spark_run.finished'",
        """SELECT 'spark_run.finished', jsonb_build_object(
                'run_id', NEW.id, 'job', NEW.job, 'outcome', NEW.state, 'attempt', NEW.attempt,
                'trigger', NEW.trigger, 'requested_by', NEW.requested_by, 'error', left(NEW.error, 2000),
                'metrics', NEW.metrics, 'started_at', NEW.started_at, 'finished_at', NEW.finished_at)""",
    )
    return [
        spark_finished,
        f"""CREATE TRIGGER webhook_spark_finished AFTER UPDATE OF state ON queue_app_sparkrun FOR EACH ROW
           WHEN (NEW.state IN ({SPARK_FINAL}) AND OLD.state NOT IN ({SPARK_FINAL}))
           EXECUTE FUNCTION queue_app_webhook_spark_finished()""",
        dead_letters,
        """CREATE TRIGGER webhook_dead_letters AFTER INSERT ON queue_app_deadletter
           REFERENCING NEW TABLE AS new_letters FOR EACH STATEMENT
           EXECUTE FUNCTION queue_app_webhook_dead_letters()""",
        worker_lost,
        """CREATE TRIGGER webhook_worker_lost AFTER UPDATE OF state ON queue_app_worker FOR EACH ROW
           WHEN (OLD.state <> 'stopped' AND NEW.state = 'stopped' AND NEW.last_heartbeat = OLD.last_heartbeat)
           EXECUTE FUNCTION queue_app_webhook_worker_lost()""",
        item_events,
    ]


DROP_SQL = [
    "DROP TRIGGER IF EXISTS webhook_spark_finished ON queue_app_sparkrun",
    "DROP FUNCTION IF EXISTS queue_app_webhook_spark_finished()",
    f"DROP TRIGGER IF EXISTS {ITEM_TRIGGER} ON queue_app_queueitem",
    "DROP TRIGGER IF EXISTS webhook_worker_lost ON queue_app_worker",
    "DROP TRIGGER IF EXISTS webhook_dead_letters ON queue_app_deadletter",
    "DROP FUNCTION IF EXISTS queue_app_webhook_item_event()",
    "DROP FUNCTION IF EXISTS queue_app_webhook_worker_lost()",
    "DROP FUNCTION IF EXISTS queue_app_webhook_dead_letters()",
]

_OPTED_IN_QUEUES = """
SELECT DISTINCT q FROM queue_app_webhookendpoint, jsonb_array_elements_text(item_event_queues) AS q
WHERE enabled AND event_types ?| %s ORDER BY q
"""
_CURRENT = """
SELECT obj_description(t.oid, 'pg_trigger') FROM pg_trigger t
WHERE t.tgname = %s AND t.tgrelid = 'queue_app_queueitem'::regclass
"""


def sync_item_event_trigger() -> list[str]:
    """Make the item.done / item.failed trigger match the endpoints: absent when no enabled endpoint opts a
    queue in, else firing only for the opted-in queues. Runs in the caller's transaction (it commits with the
    endpoint change). Returns the queues it fires for."""
    with connection.cursor() as cur:
        raw = cur.connection  # psycopg's, to render the DDL's identifiers and literals

        def run(statement: pgsql.Composable) -> None:
            cur.execute(statement.as_string(raw))

        cur.execute(_OPTED_IN_QUEUES, [list(ITEM_EVENTS)])
        queues = [row[0] for row in cur.fetchall()]
        cur.execute(_CURRENT, [ITEM_TRIGGER])
        row = cur.fetchone()
        marker = ",".join(queues)
        if (row is None and not queues) or (row is not None and row[0] == marker):
            return queues
        if not queues:
            run(pgsql.SQL("DROP TRIGGER IF EXISTS {} ON queue_app_queueitem").format(pgsql.Identifier(ITEM_TRIGGER)))
            return queues
        names = pgsql.SQL(", ").join(pgsql.Literal(q) for q in queues)
        run(
            pgsql.SQL(
                """CREATE OR REPLACE TRIGGER {name} AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
                WHEN (NEW.queue_id IN ({names}) AND OLD.state = 'reserved'
                      AND (NEW.state = 'done' OR (NEW.state IN ('ready', 'dead') AND NEW.attempts = OLD.attempts)))
                EXECUTE FUNCTION queue_app_webhook_item_event()"""
            ).format(name=pgsql.Identifier(ITEM_TRIGGER), names=names)
        )
        run(
            pgsql.SQL("COMMENT ON TRIGGER {} ON queue_app_queueitem IS {}").format(
                pgsql.Identifier(ITEM_TRIGGER), pgsql.Literal(marker)
            )
        )
    return queues
