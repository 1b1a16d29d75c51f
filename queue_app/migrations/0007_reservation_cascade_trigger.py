"""Reservation -> item without a foreign-key constraint; a statement-level trigger deletes the reservations of
deleted items instead.

The constraint's check (a deferred RI trigger event per inserted reservation, then a KEY SHARE lock of the item at
commit) was ~15% of a lease's cost. Nothing is lost with it: reservations are written only by the lease
statement, for an item row it holds locked (FOR UPDATE), so the item exists; and a deleted item's reservations go
with it, in the same statement, as the ON DELETE CASCADE did (one indexed DELETE per statement, not per row).
"""

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
CREATE FUNCTION queue_app_reservation_cascade() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- = ANY(array): index probes of reservation_item, whatever the planner guesses of the transition table
    DELETE FROM queue_app_reservation WHERE item_id = ANY(ARRAY(SELECT id FROM gone));
    RETURN NULL;
END
$$;
CREATE TRIGGER reservation_cascade AFTER DELETE ON queue_app_queueitem
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION queue_app_reservation_cascade();
"""

DROP = """
DROP TRIGGER reservation_cascade ON queue_app_queueitem;
DROP FUNCTION queue_app_reservation_cascade();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0006_hot_tables_autovacuum"),
    ]

    operations = [
        migrations.AlterField(
            model_name="reservation",
            name="item",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="reservations",
                to="queue_app.queueitem",
            ),
        ),
        migrations.RunSQL(CREATE, DROP),
    ]
