"""A deleted item takes its reservations with it. Reservation -> item has no foreign-key constraint in the
database (its check cost every lease a trigger event and a row lock); the trigger reservation_cascade deletes
the reservations of deleted items instead, in the same statement. These tests delete items every way the
project does (prune, ORM, plain SQL) and race a delete against a lease, and find no orphaned reservation."""

import inspect
import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction

from queue_app import engine, services
from queue_app.models import QueueItem, Reservation
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def orphans() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM queue_app_reservation r"
            " WHERE NOT EXISTS (SELECT 1 FROM queue_app_queueitem i WHERE i.id = r.item_id)"
        )
        return cur.fetchone()[0]


def deletes_waiting() -> int:
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            " AND query LIKE 'DELETE%%'"
        ).fetchone()[0]


def with_history(n: int, queue: str = "default") -> list[int]:
    """n items, each with two reservations (a failed attempt, then a completed one)."""
    ids = engine.enqueue_many("t", [{}] * n, queue=queue, max_attempts=3)
    for held in engine.lease([queue], n, "w1"):
        engine.fail(held, "boom", retry_in=0)
    for held in engine.lease([queue], n, "w1"):
        engine.complete(held, None)
    assert Reservation.objects.filter(item_id__in=ids).count() == 2 * n
    return ids


def test_prune_deletes_old_done_items_with_their_reservations_and_nothing_else():
    engine.ensure_queue("short")
    services.set_queue_options("short", retention=timedelta(minutes=1))
    old = with_history(30, "short")
    recent = with_history(10, "short")
    kept = with_history(20)  # default queue: longer retention
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE queue_app_queueitem SET finished_at = finished_at - interval '1 hour' WHERE id = ANY(%s)", [old]
        )

    assert engine.prune_done() == 30

    assert not QueueItem.objects.filter(id__in=old).exists()
    assert not Reservation.objects.filter(item_id__in=old).exists()
    assert Reservation.objects.filter(item_id__in=recent + kept).count() == 2 * 30
    assert orphans() == 0


def test_orm_and_sql_deletes_take_the_reservations_along():
    ids = with_history(6)
    QueueItem.objects.filter(id__in=ids[:2]).delete()
    with connection.cursor() as cur:
        cur.execute("DELETE FROM queue_app_queueitem WHERE id = ANY(%s)", [ids[2:4]])
    assert set(Reservation.objects.values_list("item_id", flat=True)) == set(ids[4:])
    assert orphans() == 0


def test_a_delete_racing_a_lease_leaves_no_orphaned_reservation():
    """The lease holds the item row locked: a concurrent DELETE waits for its commit, then deletes the item
    and the reservation the lease just wrote (the trigger's DELETE sees it)."""
    (item,) = engine.enqueue_many("t", [{}])
    deleted: list[int] = []

    def delete_it() -> None:
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
            deleted.append(conn.execute("DELETE FROM queue_app_queueitem WHERE id = %s", [item]).rowcount)

    with transaction.atomic():
        (held,) = engine.lease(["default"], 1, "w1")
        deleter = threading.Thread(target=delete_it)
        deleter.start()
        wait_for(deletes_waiting, timeout=10, what="the DELETE to wait for the lease's row lock")
    deleter.join(10)
    assert deleted == [1]
    assert not Reservation.objects.filter(id=held.reservation_id).exists()
    assert orphans() == 0


def test_the_prune_task_and_the_worker_units_prune_by_the_same_rounds(monkeypatch):
    from queue_app.engine import pruning
    from queue_app.maintenance_tasks import prune
    from queue_app.worker.maintenance import default_units

    units = {unit.name: unit.run for unit in default_units()}
    assert units["prune_done"].batch is engine.prune_round
    assert inspect.unwrap(units["history_retention"].batch) is engine.history_round  # with its interval (_history_unit)
    engine.ensure_queue("short")
    services.set_queue_options("short", retention=timedelta(minutes=1))
    old = with_history(30, "short")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE queue_app_queueitem SET finished_at = finished_at - interval '1 hour' WHERE id = ANY(%s)", [old]
        )
    monkeypatch.setattr(pruning, "PRUNE_BATCH", 7)  # 30 items: four full rounds and a last one of 2

    assert prune(None, None)["pruned"] == 30  # the task goes on while a round comes back full
    assert not QueueItem.objects.filter(id__in=old).exists() and orphans() == 0
