"""Queue-table helpers several test modules use: nested payloads, the database's clock moved forward, a raw psycopg
connection and lock waiters, the row count of every table, leases per rate window."""

import psycopg
from django.apps import apps
from django.contrib.admin.models import LogEntry
from django.db import connection, transaction

from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def advance_database_clock(seconds: int) -> None:
    """Move the clock forward by `seconds`: every stored timestamp the engine compares with now() moves back."""
    shift = f"make_interval(secs => {int(seconds)})"
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"UPDATE queue_app_queueitem SET visible_at = visible_at - {shift}, run_at = run_at - {shift},"
            f" created_at = created_at - {shift}, updated_at = updated_at - {shift},"
            f" finished_at = finished_at - {shift}, debounce_until = debounce_until - {shift}"
        )
        cur.execute(
            f"UPDATE queue_app_reservation SET reserved_at = reserved_at - {shift},"
            f" lease_expires_at = lease_expires_at - {shift}, heartbeat_at = heartbeat_at - {shift},"
            f" finished_at = finished_at - {shift}"
        )
        cur.execute(f"UPDATE queue_app_deadletter SET died_at = died_at - {shift}, requeued_at = requeued_at - {shift}")
        cur.execute(f"UPDATE queue_app_dedupclaim SET expires_at = expires_at - {shift}")


def raw_connection() -> psycopg.Connection:
    return psycopg.connect(**connection.get_connection_params())


def lock_waiters(text: str) -> int:
    with raw_connection() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            " AND query LIKE %s",
            [text + "%"],
        ).fetchone()[0]


def all_rows() -> dict[str, int]:
    """Row count of every queue_app table and of the admin log: what "nothing was written" is checked against."""
    counts = {
        model.__name__: model.objects.count()
        for label in JOBSITE_LABELS
        for model in apps.get_app_config(label).get_models()
    }
    counts["LogEntry"] = LogEntry.objects.count()
    return counts


def leases_per_window(queue: str, period: int) -> dict[int, int]:
    """Leases (reservations) of the queue's items per rate window, by the window's number since the epoch."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT floor(extract(epoch FROM r.reserved_at) / %s)::bigint, count(*)
               FROM queue_app_reservation r JOIN queue_app_queueitem i ON i.id = r.item_id
               WHERE i.queue_id = %s GROUP BY 1 ORDER BY 1""",
            [period, queue],
        )
        return dict(cur.fetchall())
