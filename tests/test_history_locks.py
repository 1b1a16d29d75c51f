"""The history's DDL (a day's partitions created or dropped) never waits for one parent table while holding the
other: a reader of the `_all` views that holds the reservation history and then asks for the item history would
close a circle with it, and PostgreSQL's deadlock check kills one of the two (CI saw the reader killed: a
benchmark's read of leases per window while workers archived). Both parents are taken at once or not at all
(NOWAIT); a reader holding either defers the step to its next round, and the reader goes on."""

import datetime as dt
import threading
import time

import psycopg
import pytest
from django.db import connection

from queue_app.engine import history

pytestmark = pytest.mark.django_db(transaction=True)

COMING = dt.date(2099, 1, 1)  # a day no other test creates
GONE = dt.date(2000, 1, 1)  # a day past every retention


def _in_thread(step) -> tuple[threading.Thread, list[int]]:
    """Run a history step as the worker's maintenance does (within_lock_timeout, its own connection)."""
    done: list[int] = []

    def run() -> None:
        try:
            done.append(history.within_lock_timeout(step, "the test's step"))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def _waits_on(reader: psycopg.Connection, thread: threading.Thread) -> list[str]:
    """Until the step ends: the statements that waited for a lock the reader holds (none, when the step never
    waits)."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as look:
        deadline = time.monotonic() + 30
        while thread.is_alive():
            query = "SELECT query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
            if blocked := [row[0] for row in look.execute(query, [reader.info.backend_pid]).fetchall()]:
                return blocked
            assert time.monotonic() < deadline, "the step neither ended nor waited"
            time.sleep(0.01)
    return []


def _reader_holding_the_reservation_history() -> psycopg.Connection:
    reader = psycopg.connect(**connection.get_connection_params())
    reader.execute("SELECT 1 FROM queue_app_reservationhistory LIMIT 0")  # ACCESS SHARE until it commits
    return reader


def _tables(day: dt.date) -> set[str]:
    return {table for table, on in history.partitions() if on == day}


def test_a_partition_is_created_without_waiting_and_a_reader_of_both_parents_goes_on():
    with _reader_holding_the_reservation_history() as reader:
        thread, done = _in_thread(lambda: history.ensure_partitions(0, today=COMING))
        blocked = _waits_on(reader, thread)
        if blocked:
            reader.rollback()  # let the waiting step go before failing
        thread.join(30)
        assert not blocked, f"the partition's creation waited for the reservation history, holding: {blocked}"
        assert done == [0] and not _tables(COMING)  # deferred to the next round
        reader.execute("SELECT 1 FROM queue_app_itemhistory LIMIT 0")  # the other parent: granted, no deadlock
        reader.commit()
    try:
        assert history.within_lock_timeout(lambda: history.ensure_partitions(0, today=COMING), "creation") == 1
        assert _tables(COMING) == {"queue_app_itemhistory_p20990101", "queue_app_reservationhistory_p20990101"}
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS queue_app_itemhistory_p20990101, queue_app_reservationhistory_p20990101")


def test_an_expired_day_is_dropped_without_waiting_and_a_reader_of_both_parents_goes_on():
    assert history.within_lock_timeout(lambda: history.ensure_partitions(0, today=GONE), "creation") == 1
    with _reader_holding_the_reservation_history() as reader:
        thread, done = _in_thread(lambda: len(history.drop_expired_partitions()))
        blocked = _waits_on(reader, thread)
        if blocked:
            reader.rollback()
        thread.join(30)
        assert not blocked, f"the day's drop waited for the reservation history, holding: {blocked}"
        assert done == [0] and len(_tables(GONE)) == 2  # deferred: both tables still there
        reader.execute("SELECT 1 FROM queue_app_itemhistory LIMIT 0")
        reader.commit()
    assert history.within_lock_timeout(lambda: len(history.drop_expired_partitions()), "drop") >= 2
    assert not _tables(GONE)
