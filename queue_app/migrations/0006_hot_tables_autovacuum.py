"""Autovacuum settings for the queue's hot tables: every lease, settle and prune leaves dead rows, and the server's
defaults (vacuum at 20% dead, throttled by cost_delay) let a busy queue's tables and indexes grow and its leases
walk past ever more dead index entries. Vacuum at 2% dead, unthrottled. (The worker's vacuum maintenance unit
covers servers where autovacuum is off.)"""

from django.db import migrations

HOT_TABLES = ("queue_app_queueitem", "queue_app_reservation", "queue_app_dedupclaim", "queue_app_deadletter")
SETTINGS = (
    "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_cost_delay = 0"
)
RESET = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
    "autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay"
)


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0005_fewer_item_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            [f"ALTER TABLE {table} SET ({SETTINGS})" for table in HOT_TABLES],
            [f"ALTER TABLE {table} RESET ({RESET})" for table in HOT_TABLES],
        )
    ]
