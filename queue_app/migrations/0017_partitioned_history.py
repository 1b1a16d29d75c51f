"""Partitioned history: finished items and their reservations move out of the hot tables into tables partitioned
by day of the item's finished time (queue_app/engine/history.py moves them; retention drops whole days).

- queue_app_itemhistory: the item's columns (LIKE queue_app_queueitem), PARTITION BY RANGE (finished_at), primary
  key (id, finished_at) (PostgreSQL wants the partition key in it; ids stay unique: they come from the hot
  table's sequence and are kept when a row moves).
- queue_app_reservationhistory: the reservation's columns (not_done_at a plain column there: it is copied), and
  item_finished_at, the partition key: an item and its reservations live in the same day and go together.
- queue_app_history_partition(day): creates that UTC day's partition of both tables if missing (the archiver and
  the maintenance loop call it; no DEFAULT partition, so a new day never has to scan one).
- queue_app_item_all / queue_app_reservation_all: hot UNION ALL history, for readers that must see a row
  exactly once whichever side it is on at the moment (one statement, one snapshot): the Spark analytics.

The migration then moves the existing finished rows (done and cancelled items without a dead letter, see
engine/history.py for why dead items stay), day by day, creating the partitions they need.
"""

from django.db import migrations, models

ITEM_COLUMNS = (
    "id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts, lease_timeout,"
    " dedup_key, ordering_key, group_key, reservation_id, result, error, workflow_step_id, created_at, updated_at,"
    " finished_at"
)
RESERVATION_COLUMNS = (
    "id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at, finished_at, started_at, outcome,"
    " error, traceback"
)

CREATE = f"""
CREATE TABLE queue_app_itemhistory (LIKE queue_app_queueitem INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (finished_at);
ALTER TABLE queue_app_itemhistory ALTER COLUMN finished_at SET NOT NULL;
ALTER TABLE queue_app_itemhistory ADD CONSTRAINT queue_app_itemhistory_pkey PRIMARY KEY (id, finished_at);
CREATE INDEX itemhistory_queue ON queue_app_itemhistory (queue_id, state, finished_at);
CREATE INDEX itemhistory_finished ON queue_app_itemhistory (finished_at);
CREATE INDEX itemhistory_task ON queue_app_itemhistory (task, state);
CREATE INDEX itemhistory_dedup_key ON queue_app_itemhistory (dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX itemhistory_ordering_key ON queue_app_itemhistory (ordering_key) WHERE ordering_key IS NOT NULL;
CREATE INDEX itemhistory_group_key ON queue_app_itemhistory (group_key) WHERE group_key IS NOT NULL;

CREATE TABLE queue_app_reservationhistory (
    LIKE queue_app_reservation INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    item_finished_at timestamptz NOT NULL
) PARTITION BY RANGE (item_finished_at);
ALTER TABLE queue_app_reservationhistory
    ADD CONSTRAINT queue_app_reservationhistory_pkey PRIMARY KEY (id, item_finished_at);
CREATE INDEX reservationhistory_item ON queue_app_reservationhistory (item_id, id);
CREATE INDEX reservationhistory_not_done ON queue_app_reservationhistory (not_done_at)
    WHERE not_done_at IS NOT NULL;
CREATE INDEX reservationhistory_reserved ON queue_app_reservationhistory (reserved_at);

CREATE FUNCTION queue_app_history_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    suffix text := to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass('queue_app_itemhistory_p' || suffix) IS NOT NULL
       AND to_regclass('queue_app_reservationhistory_p' || suffix) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF queue_app_itemhistory FOR VALUES FROM (%L) TO (%L)',
                   'queue_app_itemhistory_p' || suffix, lo, hi);
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF queue_app_reservationhistory '
                   'FOR VALUES FROM (%L) TO (%L)', 'queue_app_reservationhistory_p' || suffix, lo, hi);
    RETURN true;
END
$$;

CREATE VIEW queue_app_item_all AS
    SELECT {ITEM_COLUMNS} FROM queue_app_queueitem
    UNION ALL
    SELECT {ITEM_COLUMNS} FROM queue_app_itemhistory;
CREATE VIEW queue_app_reservation_all AS
    SELECT {RESERVATION_COLUMNS}, not_done_at FROM queue_app_reservation
    UNION ALL
    SELECT {RESERVATION_COLUMNS}, not_done_at FROM queue_app_reservationhistory;
"""

DROP = """
DROP VIEW queue_app_reservation_all;
DROP VIEW queue_app_item_all;
DROP FUNCTION queue_app_history_partition(date);
DROP TABLE queue_app_reservationhistory;
DROP TABLE queue_app_itemhistory;
"""

# The finished rows of the old layout, moved in one transaction (the migration's): every day they finished on
# gets its partition first. Items with a dead letter stay (the letter's foreign key holds them in the hot table).
MOVABLE = """
FROM queue_app_queueitem i
WHERE i.state IN ('done', 'cancelled') AND i.finished_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM queue_app_deadletter d WHERE d.item_id = i.id)
"""
MOVE = f"""
SELECT queue_app_history_partition(d) FROM (
    SELECT DISTINCT (i.finished_at AT TIME ZONE 'UTC')::date AS d {MOVABLE}) days;
CREATE TEMPORARY TABLE moving ON COMMIT DROP AS SELECT i.id, i.finished_at {MOVABLE};
WITH res AS (
    DELETE FROM queue_app_reservation r USING moving m WHERE r.item_id = m.id
    RETURNING {", ".join("r." + c for c in RESERVATION_COLUMNS.split(", "))}, r.not_done_at, m.finished_at
)
INSERT INTO queue_app_reservationhistory ({RESERVATION_COLUMNS}, not_done_at, item_finished_at) SELECT * FROM res;
WITH items AS (
    DELETE FROM queue_app_queueitem i USING moving m WHERE i.id = m.id
    RETURNING {", ".join("i." + c for c in ITEM_COLUMNS.split(", "))}
)
INSERT INTO queue_app_itemhistory ({ITEM_COLUMNS}) SELECT * FROM items;
"""

# Back to the old layout: every archived row returns to the hot tables.
UNMOVE = f"""
INSERT INTO queue_app_queueitem ({ITEM_COLUMNS}) SELECT {ITEM_COLUMNS} FROM queue_app_itemhistory;
INSERT INTO queue_app_reservation ({RESERVATION_COLUMNS}) SELECT {RESERVATION_COLUMNS} FROM queue_app_reservationhistory;
"""

ITEM_FIELDS = [
    ("id", models.BigIntegerField(primary_key=True, serialize=False)),
    ("queue_id", models.CharField(max_length=100)),
    ("task", models.CharField(max_length=200)),
    ("payload", models.JSONField(default=dict)),
    (
        "state",
        models.CharField(
            choices=[(s, s.title()) for s in ("ready", "reserved", "done", "dead", "cancelled")], max_length=10
        ),
    ),
    ("priority", models.SmallIntegerField(default=0)),
    ("run_at", models.DateTimeField()),
    ("visible_at", models.DateTimeField()),
    ("attempts", models.PositiveIntegerField(default=0)),
    ("max_attempts", models.PositiveIntegerField(default=5)),
    ("lease_timeout", models.FloatField(blank=True, null=True)),
    ("dedup_key", models.CharField(blank=True, max_length=200, null=True)),
    ("ordering_key", models.CharField(blank=True, max_length=200, null=True)),
    ("group_key", models.CharField(blank=True, max_length=200, null=True)),
    ("reservation_id", models.BigIntegerField(blank=True, null=True)),
    ("result", models.JSONField(blank=True, null=True)),
    ("error", models.TextField(blank=True, default="")),
    ("workflow_step_id", models.BigIntegerField(blank=True, null=True)),
    ("created_at", models.DateTimeField()),
    ("updated_at", models.DateTimeField()),
    ("finished_at", models.DateTimeField()),
]
RESERVATION_FIELDS = [
    ("id", models.BigIntegerField(primary_key=True, serialize=False)),
    ("item_id", models.BigIntegerField()),
    ("attempt", models.PositiveIntegerField()),
    ("worker_id", models.CharField(max_length=200)),
    ("reserved_at", models.DateTimeField()),
    ("lease_expires_at", models.DateTimeField()),
    ("heartbeat_at", models.DateTimeField()),
    ("finished_at", models.DateTimeField(blank=True, null=True)),
    ("started_at", models.DateTimeField(blank=True, null=True)),
    (
        "outcome",
        models.CharField(
            blank=True,
            choices=[
                (o, o.replace("_", " ").title())
                for o in ("done", "retry", "dead", "expired", "released", "cancelled", "timed_out")
            ],
            max_length=10,
            null=True,
        ),
    ),
    ("not_done_at", models.DateTimeField(blank=True, null=True)),
    ("error", models.TextField(blank=True, default="")),
    ("traceback", models.TextField(blank=True, default="")),
    ("item_finished_at", models.DateTimeField()),
]


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0016_spark_connect_server"),
    ]

    operations = [
        # The tables are written here (partitioned: beyond what a model can declare); the models give Django
        # their columns, and being managed they are flushed between tests like every other table.
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE, DROP), migrations.RunSQL(MOVE, UNMOVE)],
            state_operations=[
                migrations.CreateModel(
                    name="ItemHistory",
                    fields=ITEM_FIELDS,
                    options={
                        "verbose_name": "archived item",
                        "verbose_name_plural": "item history",
                        "db_table": "queue_app_itemhistory",
                        "ordering": ["-id"],
                    },
                ),
                migrations.CreateModel(
                    name="ReservationHistory",
                    fields=RESERVATION_FIELDS,
                    options={
                        "verbose_name": "archived reservation",
                        "verbose_name_plural": "reservation history",
                        "db_table": "queue_app_reservationhistory",
                        "ordering": ["-id"],
                    },
                ),
            ],
        ),
    ]
