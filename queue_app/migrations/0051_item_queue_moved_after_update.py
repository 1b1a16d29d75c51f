"""The item -> queue check of an UPDATE that moves an item (trigger item_queue_moved, migration 0008) fires AFTER
the row's update instead of BEFORE it. The same rule, the same lock and the same error.

Why: any BEFORE ROW UPDATE trigger on a table, whatever its column list or WHEN, makes PostgreSQL lock each row
an UPDATE is about to change before it changes it (ExecBRUpdateTriggers -> GetTupleForTrigger), one more WAL
record and buffer write per row. No engine statement moves an item, yet every settle paid it: a worker's
complete of a batch locked each of its items first (the lease's rows are already locked by its FOR UPDATE and
pay nothing). An AFTER ROW trigger reads the row's old version without a lock.

The races keep their outcomes. A move whose queue is being deleted: its trigger's FOR KEY SHARE waits for the
delete, then finds the queue gone and raises (before, the move itself waited). A delete of the queue an open
move named: it waits for the mover's lock and then sees the moved item (tests/core/in_process/
test_engine_queue_integrity.py forces both).

Measured on the settle-and-lease statement alone (2 connections x batch 500, drains of 20,000-40,000 items in
turns): 50-60 bytes less WAL per item, the lock's record (1,459-1,472 against 1,507-1,530 in 16 of 19 pairs); its
items/s within this VM's noise (means of four series: 34,100 / 31,900, 28,600 / 29,600, 31,500 / 29,800, 31,000 /
31,100); docs/benchmarks.md.
"""

from django.db import migrations

MOVED = """
CREATE OR REPLACE FUNCTION queue_app_item_queue_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM queue_app_queue WHERE name = NEW.queue_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('queue item %s moved to queue %L, which does not exist', NEW.id, NEW.queue_id);
    END IF;
    RETURN {returns};
END
$$;
DROP TRIGGER item_queue_moved ON queue_app_queueitem;
-- UPDATE OF queue_id: only statements that set the column fire it (no engine statement does).
CREATE TRIGGER item_queue_moved {when} UPDATE OF queue_id ON queue_app_queueitem
    FOR EACH ROW WHEN (OLD.queue_id IS DISTINCT FROM NEW.queue_id) EXECUTE FUNCTION queue_app_item_queue_moved();
"""


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0050_enqueue_reads_its_queue_once")]

    operations = [
        migrations.RunSQL(
            MOVED.format(returns="NULL", when="AFTER"), reverse_sql=MOVED.format(returns="NEW", when="BEFORE")
        )
    ]
