"""The vacuum maintenance unit: when the hot tables' dead rows pile up (autovacuum off, throttled or busy), a
worker vacuums them itself, in a thread of its own, skipping a table another VACUUM holds."""

import pytest
from django.db import connection

from queue_app import engine
from queue_app.engine import leaders, sql
from queue_app.models import Leader
from queue_app.worker.maintenance import _analyze_unit, _vacuum_unit
from tests.support.waiting import wait_for

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


def vacuums(table: str = ITEM) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = %s", [table])
        return cur.fetchone()[0]


def snapshot_holders() -> list[tuple]:
    """Other sessions of this database holding a snapshot: dead rows younger than theirs cannot be removed."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid, application_name, state, backend_xmin, left(query, 120) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
        )
        return cur.fetchall()


def wait_cleared(before: int) -> None:
    """Wait for a VACUUM of the item table to have run (not skipped: vacuum_count went past `before`) and
    removed the dead rows; on timeout, say what was seen and which sessions held snapshots."""
    try:
        wait_for(lambda: vacuums() > before and dead_rows() < 1_000, timeout=15, what="VACUUM to clear the dead rows")
    except AssertionError as exc:
        seen = f"vacuum_count {before} -> {vacuums()}, dead rows {dead_rows()}, snapshots held by {snapshot_holders()}"
        raise AssertionError(f"{exc}; {seen}") from None


def churn(n: int) -> None:
    """n items through their whole life (queued, done, pruned): the dead rows a busy queue leaves behind. First
    waits for earlier tests' sessions to let go of their snapshots (otherwise the rows are not removable)."""
    wait_for(lambda: not snapshot_holders(), timeout=30, what="no other session holding a snapshot")
    engine.enqueue_many("t", [{}] * n)
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {ITEM} SET state = 'done', finished_at = now() WHERE state = 'ready'")
        cur.execute(f"DELETE FROM {ITEM} WHERE state = 'done'")
    # This session's table statistics are sent at most once a second: sent later than the VACUUM's own report,
    # they would add these dead rows back on top of its count. Send them now.
    dead_rows()


@pytest.mark.django_db(transaction=True)
def test_a_table_full_of_dead_rows_is_found_and_vacuumed():
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    assert dead_rows() >= 30_000

    before = vacuums()
    took = engine.vacuum([ITEM])

    assert set(took) == {ITEM}
    wait_cleared(before)
    assert ITEM not in engine.bloated_tables()


@pytest.mark.django_db(transaction=True)
def test_the_offers_of_many_hand_offs_are_vacuumed_too():
    """Every item handed off inserts an offer and deletes it, and every enqueue that may take one reads the table
    whole: 2,000 of them, which would not make the item table bloated, make the offer table so, and the
    worker's VACUUM clears it."""
    handoff = sql.HANDOFF
    wait_for(lambda: not snapshot_holders(), timeout=30, what="no other session holding a snapshot")
    with connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {handoff} SET (autovacuum_enabled = off)")
        try:
            cur.execute(
                f"""INSERT INTO {handoff} (worker_id, channel, lock_key, queues, terms, offered_at)
                    SELECT 'w-' || n, 'c', n, NULL, '{{}}', now() FROM generate_series(1, 2000) n"""
            )
            cur.execute(f"DELETE FROM {handoff}")
            dead_rows(handoff)
            wait_for(lambda: handoff in engine.bloated_tables(), timeout=15, what="the offers' dead rows counted")
            assert handoff not in engine.bloated_tables(min_dead_offers=20_000)
            before = vacuums(handoff)

            assert set(engine.vacuum([handoff]) or {}) == {handoff}
            wait_for(lambda: vacuums(handoff) > before and dead_rows(handoff) == 0, timeout=15, what="VACUUM")
        finally:
            cur.execute(f"ALTER TABLE {handoff} RESET (autovacuum_enabled)")
            cur.execute(f"ANALYZE {handoff}")  # its rows' churn counted: left as the analyze unit would


@pytest.mark.django_db(transaction=True)
def test_few_dead_rows_are_left_to_autovacuum():
    churn(500)
    assert engine.bloated_tables() == []


@pytest.mark.django_db(transaction=True)
def test_the_unit_vacuums_in_a_thread_of_its_own_and_starts_one_at_a_time():
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    unit = _vacuum_unit()
    before = vacuums()

    counts, more = unit()
    running = unit.thread
    assert counts["vacuum_started"] >= 1 and not more and running is not None
    if running.is_alive():
        assert unit() == ({}, False)  # one VACUUM thread at a time
    running.join(60)
    assert not running.is_alive()
    wait_cleared(before)


@pytest.mark.django_db(transaction=True)
def test_vacuum_and_analyze_take_turns_in_one_thread_so_a_worker_opens_one_connection_for_them():
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    shared: list = [None]
    vacuum, analyze = _vacuum_unit(shared), _analyze_unit(shared)
    before = vacuums()

    counts, _ = vacuum()
    running = vacuum.thread
    assert counts["vacuum_started"] >= 1 and running is not None and analyze.thread is running
    if running.is_alive():
        assert analyze() == ({}, False)  # its turn comes when the VACUUM's thread has ended
    running.join(60)
    wait_cleared(before)


def analyzes(table: str = ITEM) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT analyze_count FROM pg_stat_user_tables WHERE relname = %s", [table])
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_one_vacuum_or_analyze_of_the_hot_tables_runs_at_a_time_in_the_whole_deployment(caplog):
    """Another worker's VACUUM or ANALYZE holds the table maintenance duty (its leader row): this one does nothing
    and says so (None; the unit at INFO, once per period, naming the holder); once the other's row is handed back
    it vacuums, and hands the duty back itself (no row left, no session lock held)."""
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    before = vacuums()
    assert leaders.take(leaders.TABLE_MAINTENANCE, "other-worker")

    assert engine.vacuum([ITEM]) is None
    assert engine.analyze([ITEM]) is None
    assert vacuums() == before and ITEM in engine.bloated_tables()
    unit = _vacuum_unit(holder="this-worker")
    with caplog.at_level("INFO", logger="jobsite.worker"):
        for _ in range(2):
            unit()
            unit.join(60)
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 1 and "other-worker" in said[0] and "vacuum-analyze" in said[0]  # once per period

    leaders.release("other-worker", leaders.TABLE_MAINTENANCE)
    assert set(engine.vacuum([ITEM], holder="this-worker") or {}) == {ITEM}
    wait_cleared(before)
    assert not Leader.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_table_maintenance_duty_left_by_a_dead_holder_is_taken_over_once_it_expires():
    """A holder that died (no heartbeat renews its row) keeps the duty only until its expiry."""
    assert leaders.take(leaders.TABLE_MAINTENANCE, "dead-worker", seconds=0.2)
    assert not leaders.take(leaders.TABLE_MAINTENANCE, "this-worker")
    wait_for(
        lambda: leaders.take(leaders.TABLE_MAINTENANCE, "this-worker"),
        timeout=10,
        what="the dead holder's row to expire",
    )
    assert Leader.objects.get().holder == "this-worker"
    assert leaders.renew("dead-worker") == set() and leaders.renew("this-worker") == {leaders.TABLE_MAINTENANCE}
    leaders.release("this-worker")
    assert not Leader.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_vacuum_leaves_analyzing_to_the_analyze_unit_which_analyzes_a_churned_table_once_a_while():
    """VACUUM no longer analyzes (it cost most of each VACUUM's time on a busy item table). A table whose rows
    have all changed since its last ANALYZE is analyzed by the analyze unit, at most once every `every` s."""
    engine.analyze([ITEM])
    churn(30_000)
    wait_for(lambda: ITEM in engine.bloated_tables(), timeout=15, what="the dead rows to show in the statistics")
    analyzed = analyzes()

    assert set(engine.vacuum([ITEM]) or {}) == {ITEM}
    assert analyzes() == analyzed

    assert ITEM not in engine.stale_statistics(every=3600)  # analyzed a moment ago
    assert ITEM in engine.stale_statistics(every=0)  # every row changed since
    engine.analyze([ITEM])
    assert ITEM not in engine.stale_statistics(every=0)
