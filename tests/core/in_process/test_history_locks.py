"""The history's DDL (a day's partitions created or dropped) never holds one parent table while it waits for the
other: a reader of the `_all` views that holds the reservation history and then asks for the item history would
close a circle with it, and PostgreSQL's deadlock check kills one of the two (CI saw the reader killed: a
benchmark's read of leases per window while workers archived). queue_app_lock_history (migration 0041) waits for
the reservation history holding nothing of the history, then takes the item history without waiting."""

import datetime as dt
import threading
import time

import psycopg
import pytest
from django.db import connection, transaction

from queue_app.engine import history

pytestmark = pytest.mark.django_db(transaction=True)

COMING = dt.date(2099, 1, 1)  # a day no other test creates
GONE = dt.date(2000, 1, 1)  # a day past every retention
LOCKS_ON_THE_ITEM_HISTORY = """
SELECT l.mode FROM pg_locks l WHERE l.pid = %s AND l.granted AND l.relation = 'queue_app_itemhistory'::regclass
"""


def _in_thread(step) -> tuple[threading.Thread, list[int]]:
    """Run a history step in a transaction on a connection of its own, with no lock_timeout: only the reader
    decides when it goes on."""
    done: list[int] = []

    def run() -> None:
        try:
            with transaction.atomic():
                done.append(step())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def _waiting_on(reader: psycopg.Connection, look: psycopg.Connection) -> int:
    """The backend of the step, once it waits for a lock the reader holds."""
    deadline = time.monotonic() + 30
    query = "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
    while not (rows := look.execute(query, [reader.info.backend_pid]).fetchall()):
        assert time.monotonic() < deadline, "the step should wait for the reservation history the reader holds"
        time.sleep(0.01)
    return rows[0][0]


def _tables(day: dt.date) -> set[str]:
    return {table for table, on in history.partitions() if on == day}


def _reader_of_both_parents_goes_on(step) -> list[int]:
    """A reader holds the reservation history; the step waits for it holding nothing of the item history; the
    reader's read of the item history is granted at once (a circle would have made it wait, then one of the two
    killed); once the reader commits, the step goes through. Returns what the step returned."""
    params = connection.get_connection_params()
    with psycopg.connect(**params) as reader, psycopg.connect(**params, autocommit=True) as look:
        reader.execute("SELECT 1 FROM queue_app_reservationhistory LIMIT 0")  # ACCESS SHARE until it commits
        thread, done = _in_thread(step)
        try:
            step_pid = _waiting_on(reader, look)
            held = [row[0] for row in look.execute(LOCKS_ON_THE_ITEM_HISTORY, [step_pid]).fetchall()]
            assert held == [], f"the step holds the item history ({held}) while it waits for the reservation history"
            reader.execute("SET LOCAL lock_timeout = '10s'")  # a circle would fail the read within deadlock_timeout
            reader.execute("SELECT 1 FROM queue_app_itemhistory LIMIT 0")
        finally:
            reader.commit()
            thread.join(30)
    assert not thread.is_alive()
    return done


def test_a_partition_is_created_without_holding_one_parent_while_waiting_for_the_other():
    try:
        assert _reader_of_both_parents_goes_on(lambda: history.ensure_partitions(0, today=COMING)) == [1]
        assert _tables(COMING) == {"queue_app_itemhistory_p20990101", "queue_app_reservationhistory_p20990101"}
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS queue_app_itemhistory_p20990101, queue_app_reservationhistory_p20990101")


def test_an_expired_day_is_dropped_without_holding_one_parent_while_waiting_for_the_other():
    assert history.within_lock_timeout(lambda: history.ensure_partitions(0, today=GONE), "creation") == 1
    (dropped,) = _reader_of_both_parents_goes_on(lambda: len(history.drop_expired_partitions()))
    assert dropped >= 2 and not _tables(GONE)
