"""A history partition's CREATE takes both parents' locks at once, or none (NOWAIT).

queue_app_history_partition (migration 0017) created the item history's partition, then the reservation
history's: it held the item history's ACCESS EXCLUSIVE lock while it waited for the reservation history's. A
reader of the `_all` views that had locked the reservation history and then asked for the item history (a join of
the two views locks them in its own order) closed the circle, and PostgreSQL's deadlock check killed one of the two
(seen in CI: a benchmark's read of leases per window, with workers archiving at once). Now the function first
takes both parents in one LOCK ... NOWAIT: it never waits while holding a lock, so it cannot be part of a circle;
when a reader holds either, it fails at once (lock_not_available) and the caller leaves the creation to its next
round (engine/history.py: within_lock_timeout)."""

from django.db import migrations

NOWAIT = """
CREATE OR REPLACE FUNCTION queue_app_history_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    suffix text := to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass('queue_app_itemhistory_p' || suffix) IS NOT NULL
       AND to_regclass('queue_app_reservationhistory_p' || suffix) IS NOT NULL THEN
        RETURN false;
    END IF;
    LOCK TABLE queue_app_itemhistory, queue_app_reservationhistory IN ACCESS EXCLUSIVE MODE NOWAIT;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF queue_app_itemhistory FOR VALUES FROM (%L) TO (%L)',
                   'queue_app_itemhistory_p' || suffix, lo, hi);
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF queue_app_reservationhistory '
                   'FOR VALUES FROM (%L) TO (%L)', 'queue_app_reservationhistory_p' || suffix, lo, hi);
    RETURN true;
END
$$;
"""

WAITING = """
CREATE OR REPLACE FUNCTION queue_app_history_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
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
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0040_stale_episode_producer"),
    ]

    operations = [migrations.RunSQL(NOWAIT, WAITING)]
