"""The vacuum maintenance unit: when the hot tables' dead rows pile up (autovacuum off, throttled or busy), a
worker vacuums them itself, in a thread of its own, skipping a table another VACUUM holds."""

import pytest
from django.db import connection

from queue_app import engine
from queue_app.worker.maintenance import _Vacuum
from tests.waiting import wait_for

ITEM = "queue_app_queueitem"


@pytest.fixture(autouse=True)
def no_autovacuum_on_the_item_table(django_db_blocker):
    """These tests are about the worker's own VACUUM: an autovacuum of the same table (the embedded server runs
    it, with this table's 2% threshold) would clear the dead rows first or hold the table so that VACUUM
    (SKIP_LOCKED) skips it. Off for the item table during each test, back on afterwards."""
    with django_db_blocker.unblock(), connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {ITEM} SET (autovacuum_enabled = off)")
    yield
    with django_db_blocker.unblock(), connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {ITEM} RESET (autovacuum_enabled)")


def dead_rows(table: str = ITEM) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [table])
        return cur.fetchone()[0]


def churn(n: int) -> None:
    """n items through their whole life (queued, done, pruned): the dead rows a busy queue leaves behind."""
    engine.enqueue_many("t", [{}] * n)
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {ITEM} SET state = 'done', finished_at = now() WHERE state = 'ready'")
        cur.execute(f"DELETE FROM {ITEM} WHERE state = 'done'")


@pytest.mark.django_db(transaction=True)
def test_a_table_full_of_dead_rows_is_found_and_vacuumed():
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    assert dead_rows() >= 30_000

    took = engine.vacuum([ITEM])

    assert set(took) == {ITEM}
    wait_for(lambda: dead_rows() < 1_000, timeout=15, what="VACUUM to clear the dead rows")
    assert ITEM not in engine.bloated_tables()


@pytest.mark.django_db(transaction=True)
def test_few_dead_rows_are_left_to_autovacuum():
    churn(500)
    assert engine.bloated_tables() == []


@pytest.mark.django_db(transaction=True)
def test_the_unit_vacuums_in_a_thread_of_its_own_and_starts_one_at_a_time():
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    unit = _Vacuum()

    counts, more = unit()
    running = unit.thread
    assert counts["vacuum_started"] >= 1 and not more and running is not None
    if running.is_alive():
        assert unit() == ({}, False)  # one VACUUM thread at a time
    running.join(60)
    assert not running.is_alive()
    wait_for(lambda: dead_rows() < 1_000, timeout=15, what="the unit's VACUUM to clear the dead rows")
