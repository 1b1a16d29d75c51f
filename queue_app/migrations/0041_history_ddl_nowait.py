"""A history partition's CREATE and a day's DROP never wait for one history parent while holding the other.

queue_app_history_partition (migration 0017) created the item history's partition, then the reservation
history's: it held the item history's ACCESS EXCLUSIVE lock while it waited for the reservation history's. A
reader of the `_all` views that had locked the reservation history and then asked for the item history (a join of
the two views locks them in its own order) closed the circle, and PostgreSQL's deadlock check killed one of the two
(seen in CI: a benchmark's read of leases per window, with workers archiving at once).

queue_app_lock_history() takes both parents before any such DDL: it waits for the reservation history (holding
nothing of the history, so no circle can form), then takes the item history without waiting (NOWAIT); when that
one is held, it lets both go, waits 20 ms and tries again, until `budget` has passed (then lock_not_available, and
the caller leaves the step to its next round: engine/history.py, within_lock_timeout). A waiting lock is still
bounded by the caller's lock_timeout."""

from django.db import migrations

LOCK_HISTORY = """
CREATE OR REPLACE FUNCTION queue_app_lock_history(budget interval DEFAULT '2 s') RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + budget;
BEGIN
    LOOP
        BEGIN
            LOCK TABLE queue_app_reservationhistory IN ACCESS EXCLUSIVE MODE;
            LOCK TABLE queue_app_itemhistory IN ACCESS EXCLUSIVE MODE NOWAIT;
            RETURN;  -- the block's locks stay with the transaction
        EXCEPTION WHEN lock_not_available THEN  -- the block's locks are let go
            IF clock_timestamp() >= deadline THEN
                RAISE;
            END IF;
        END;
        PERFORM pg_sleep(0.02);
    END LOOP;
END
$$;
"""

# The partition function of migration 0017, with {lock} where this migration takes both parents first.
PARTITION = """
CREATE OR REPLACE FUNCTION queue_app_history_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    suffix text := to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass('queue_app_itemhistory_p' || suffix) IS NOT NULL
       AND to_regclass('queue_app_reservationhistory_p' || suffix) IS NOT NULL THEN
        RETURN false;
    END IF;{lock}
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF queue_app_itemhistory FOR VALUES FROM (%L) TO (%L)',
                   'queue_app_itemhistory_p' || suffix, lo, hi);
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF queue_app_reservationhistory '
                   'FOR VALUES FROM (%L) TO (%L)', 'queue_app_reservationhistory_p' || suffix, lo, hi);
    RETURN true;
END
$$;
"""

NOWAIT = LOCK_HISTORY + PARTITION.replace("{lock}", "\n    PERFORM queue_app_lock_history();")
WAITING = "\nDROP FUNCTION IF EXISTS queue_app_lock_history(interval);" + PARTITION.replace("{lock}", "")


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0040_stale_episode_producer"),
    ]

    operations = [migrations.RunSQL(NOWAIT, WAITING)]
