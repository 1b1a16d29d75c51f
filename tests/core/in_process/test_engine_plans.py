"""The engine's statements run as prepared statements with generic plans (sql.ENGINE_SESSION): each is planned
once per connection, without its parameters' values and on whatever statistics the tables have then. So every
one must stay index probes of the large tables whatever the estimates: planned on the statistics of an empty
table and then run on a large one (a fresh deployment, or a queue filled right after an ANALYZE), it must not
scan the item or reservation table, nor read a partial index whole. A plan that did cost a worker seconds per
batch: a settle that took the items first and scanned its own list once per item, 174 ms for 1,000 items;
one that read every done item (item_task_history) to find the few this settle repeats."""

import re
import threading
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from queue_app import engine
from queue_app.engine import sql
from queue_app.worker.maintenance import _analyze_unit
from queue_app.workflows import sql as workflow_sql
from tests.support.prepared_statements import positional
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

BIG = ("queue_app_queueitem", "queue_app_reservation")
# Also read by the settle-and-lease statement (the queues' terms): an autovacuum ANALYZE of it invalidates the
# statement's cached plan, which is then made again on the grown tables (once in CI: the plan the test expected
# stale read them by index already). So no autovacuum on it either while a test watches cached plans.
READ_BY_THE_LEASE = (*BIG, "queue_app_queue")
# Run under TRY_MAINTENANCE_LOCK, which plans them per call (plan_cache_mode auto for its transaction).
MAINTENANCE = {"PRUNE_DONE", "PRUNE_DEDUP", "RESCUE_EXPIRED", "SWEEP_WORKERS", "BLOATED_TABLES"}
# The archiver and the history's retention (engine/history.py), maintenance units too.
MAINTENANCE |= {"ARCHIVE_PICK", "ARCHIVE_MOVE", "ENSURE_PARTITIONS", "HISTORY_PARTITIONS", "RETENTIONS"}
MAINTENANCE |= {"PRUNE_HISTORY", "STALE_STATISTICS"}
# ... and RESTORE_ITEMS (a requeue from the history) runs on Django's cursor: planned per call, never generic.
NOT_PLANNED = {
    "COPY_ITEMS",
    "COPY_DELAYED_ITEMS",
    "VACUUM",
    "ANALYZE",
    "ENGINE_SESSION",
    "DROP_PARTITION",
    "RESTORE_ITEMS",
}


@pytest.fixture(autouse=True)
def engine_session(transactional_db) -> Iterator[None]:
    """The test's connection as the worker's own connections are (engine.engine_session_here): sql.ENGINE_SESSION
    set. Reset afterwards: the other tests' connections are the project's, which keep PostgreSQL's defaults."""
    with connection.cursor() as cur:
        cur.execute(sql.ENGINE_SESSION)
    yield
    with connection.cursor() as cur:
        cur.execute("RESET plan_cache_mode; RESET jit")


def statements() -> dict[str, str]:
    """The engine's statements, and the workflow statements the services run (queue_app/workflows/sql.py; its
    functions and triggers, run inside the settle, are not prepared statements)."""
    return {
        name: text
        for name, text in vars(sql).items()
        if name.isupper()  # the upper-case names without a space are table names
        and not name.startswith("_")
        and isinstance(text, str)
        and " " in text.strip()
        and name not in NOT_PLANNED | MAINTENANCE
    } | {name: getattr(workflow_sql, name) for name in ("WORKFLOW_ENQUEUE", "WORKFLOW_FINISH", "WORKFLOW_FAN_OUT")}


def generic_plans(texts: dict[str, str]) -> dict[str, list[str]]:
    plans = {}
    with connection.cursor() as cur:
        for name, text in texts.items():
            numbered, n = positional(text)
            cur.execute("PREPARE planned AS " + numbered)
            cur.execute("EXPLAIN EXECUTE planned" + (f"({', '.join(['NULL'] * n)})" if n else ""))
            plans[name] = [row[0] for row in cur.fetchall()]
            cur.execute("DEALLOCATE planned")
    return plans


def reads_whole(plan: list[str]) -> list[str]:
    """Scans of a large table, and index scans with no index condition (a partial index read whole)."""
    found = []
    for n, line in enumerate(plan):
        if "Seq Scan" in line and any(table in line for table in BIG):
            found.append(line.strip())
        elif re.search(r"Index (Only )?Scan( Backward)? using (item_|reservation_)", line):
            detail = []
            for below in plan[n + 1 :]:
                if "->" in below:
                    break
                detail.append(below)
            if not any("Index Cond" in d for d in detail):
                found.append(line.strip())
    return found


def finish_all(queue: str, batch: int = 5_000) -> None:
    done: list = []
    while True:
        out = engine.settle_and_lease([(h, None) for h in done], [queue], batch, "w1", 600)
        if not (done := out.leases):
            break


@pytest.fixture
def planned_empty_then_filled() -> Iterator[None]:
    """Statistics of a table whose items were all done and then pruned (the benchmark's case, and any queue's
    after a quiet spell): column statistics of done items, no rows, small indexes. Then, none of it analyzed,
    30,000 ready items in a paused queue, 10,000 done items with their reservations and 1,000 in flight."""
    with connection.cursor() as cur:
        for table in BIG:  # no autovacuum ANALYZE while this runs: the point is statistics out of date
            cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    engine.enqueue_many("t", [{}] * 5_000, queue="history")
    finish_all("history")
    with connection.cursor() as cur:
        for table in BIG:
            cur.execute(f"ANALYZE {table}")
        cur.execute("DELETE FROM queue_app_queueitem")
        for table in BIG:
            cur.execute(f"VACUUM ANALYZE {table}")
    engine.enqueue_many("t", [{}] * 30_000, queue="backlog")
    engine.enqueue_many("t", [{}] * 10_000, queue="history")
    finish_all("history")
    engine.enqueue_many("t", [{}] * 1_000, queue="history")
    engine.lease(["history"], 1_000, "w1", 600)
    with connection.cursor() as cur:
        cur.execute("UPDATE queue_app_queue SET paused = true WHERE name = 'backlog'")
    yield
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(BIG)} CASCADE")
        for table in BIG:  # statistics are not rolled back: leave those of empty tables to the tests after
            cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
            cur.execute(f"ANALYZE {table}")


def test_every_statement_keeps_to_index_probes_when_planned_on_out_of_date_statistics(planned_empty_then_filled):
    checked = statements()
    assert {
        "SETTLE_AND_LEASE",
        "LEASE_OPEN",
        "LEASE",
        "LEASE_FAIR",
        "LOCK_FLOW_QUEUE",
        "COMPLETE_MANY",
        "FAIL",
        "RENEW_LEASES",
        "EXTEND_MANY",
        "SPEND_RATE",
    } <= checked.keys()
    # What FAIL was: a row by its primary key, its state a plain constant test. The check must see that one.
    checked["naive FAIL"] = """SELECT id FROM queue_app_queueitem
                               WHERE id = %(item_id)s AND reservation_id = %(reservation_id)s AND state = 'reserved'"""

    plans = generic_plans(checked)

    assert {name: reads_whole(plan) for name, plan in plans.items() if reads_whole(plan)}.keys() == {"naive FAIL"}


def _settings_in_a_thread(mark: bool) -> tuple[str, str, str]:
    """plan_cache_mode, jit and jit's default on a new connection of a new thread, marked as the worker's own or
    not (issue 45: jobsite leaves the rest of a project's connections as they open)."""
    found: list = []

    def run() -> None:
        try:
            if mark:
                engine.engine_session_here()
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT current_setting('plan_cache_mode'), current_setting('jit'), reset_val"
                    " FROM pg_settings WHERE name = 'jit'"
                )
                found.append(cur.fetchone())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return found[0]


def test_the_workers_connections_plan_engine_statements_once_and_never_jit_compile_and_no_other_connection_does():
    plan_mode, jit, _ = _settings_in_a_thread(mark=True)
    assert (plan_mode, jit) == ("force_generic_plan", "off")
    plan_mode, jit, default_jit = _settings_in_a_thread(mark=False)
    assert (plan_mode, jit) == ("auto", default_jit)


def test_behind_a_transaction_pooler_not_even_the_workers_connections_get_session_settings(settings):
    settings.JOBSITE = {**getattr(settings, "JOBSITE", {}), "CONNECTION_POOLER": "transaction"}
    plan_mode, jit, default_jit = _settings_in_a_thread(mark=True)
    assert (plan_mode, jit) == ("auto", default_jit)
    assert not engine.db.prepared() and not isinstance(engine.db.cursor(), engine.db.PreparedCursor)


def test_maintenance_plans_per_call_until_its_transaction_ends():
    def mode() -> str:
        with connection.cursor() as cur:
            cur.execute("SELECT current_setting('plan_cache_mode')")
            return cur.fetchone()[0]

    with transaction.atomic():
        assert engine.try_maintenance_lock("plans-test")
        assert mode() == "auto"
    assert mode() == "force_generic_plan"


def test_the_lease_numbers_reservations_from_the_reservation_id_sequence():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_serial_sequence('queue_app_reservation', 'id')::regclass = %s::regclass",
            [sql.RESERVATION_SEQUENCE],
        )
        assert cur.fetchone()[0] is True


@pytest.mark.parametrize(
    ("table", "sequence"),
    [("queue_app_workflowstep", workflow_sql.STEP_SEQUENCE), ("queue_app_queueitem", sql.ITEM_SEQUENCE)],
)
def test_a_fan_out_numbers_steps_and_items_from_their_id_sequences(table, sequence):
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_serial_sequence(%s, 'id')::regclass = %s::regclass", [table, sequence])
        assert cur.fetchone()[0] is True


@pytest.fixture
def empty_tables_analyzed() -> Iterator[None]:
    """The hot tables empty and analyzed so (a worker starting on an idle queue, or any queue analyzed after it
    drained), no autovacuum to analyze them behind the test's back. Truncated first: pages and index entries
    left by earlier tests of the suite (rolled back, dead) count in the planner's costs, and on a table of a few
    thousand rows they can tip a probe into a scan (once in CI: the settle's expired-lease update read 5,000
    reservations whole after the re-plan)."""
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(BIG)} CASCADE")
        for table in READ_BY_THE_LEASE:
            cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            cur.execute(f"VACUUM ANALYZE {table}")
    yield
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(BIG)} CASCADE")
        for table in READ_BY_THE_LEASE:
            cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
            cur.execute(f"ANALYZE {table}")


def test_plans_made_on_an_empty_table_are_made_again_once_the_analyze_unit_sees_it_grown(empty_tables_analyzed):
    """A connection plans a statement once, on the table as it is then. Made on an empty table, the settle reads
    the item and reservation tables whole (once per item of the batch); once the table has grown, the worker's
    analyze unit finds it and ANALYZEs it, and the new statistics make the session plan the statement again."""
    hot = {name: text for name, text in statements().items() if name in ("COMPLETE_MANY", "SETTLE_AND_LEASE")}
    assert engine.stale_statistics() == []

    def cached_plans() -> dict[str, list[str]]:
        found = {}
        with connection.cursor() as cur:
            for name in hot:
                _, n = positional(hot[name])
                cur.execute(f"EXPLAIN EXECUTE {name}({', '.join(['NULL'] * n)})")
                found[name] = reads_whole([row[0] for row in cur.fetchall()])
        return found

    with connection.cursor() as cur:
        for name, text in hot.items():
            cur.execute(f"PREPARE {name} AS {positional(text)[0]}")
    try:
        assert all(cached_plans().values())  # planned now, on the empty tables: they read them whole
        engine.enqueue_many("t", [{}] * 30_000, queue="filled")
        engine.lease(["filled"], 5_000, "w1", 600)
        assert all(cached_plans().values())  # the same plans, on 30,000 rows: what a worker ran for seconds

        # Both grown tables, as the statistics collector reports them (a moment late under load: else the unit
        # would find the item table only, and the settle's plan would still read the reservations whole).
        grown = {"queue_app_queueitem", "queue_app_reservation"}
        wait_for(lambda: grown <= set(engine.stale_statistics()), 30, what="both tables reported grown")
        unit = _analyze_unit()
        counts, _ = unit()
        assert counts["analyze_started"] >= 1
        unit.thread.join(60)

        # Planned again, on the new statistics: index probes. One exception is the planner's to make: the lease's
        # update of expired leases' reservations (r_1, rows the lease took back) may hash-join the reservation
        # table, 5,000 rows here, when it guesses many such rows (once in CI); on a large table it probes.
        replanned = cached_plans()
        assert replanned["COMPLETE_MANY"] == []
        assert [line for line in replanned["SETTLE_AND_LEASE"] if "queue_app_reservation r_1 " not in line] == []
        assert "queue_app_queueitem" not in engine.stale_statistics()
    finally:
        with connection.cursor() as cur:
            for name in hot:
                cur.execute(f"DEALLOCATE {name}")


def test_a_table_filling_from_empty_is_found_stale_at_a_few_hundred_rows(empty_tables_analyzed):
    """Its size in pages is current (no wait for the statistics collector), and a few dozen pages are enough: an
    ANALYZE of a small table is cheap, and until one runs every lease runs on plans made for an empty table."""
    engine.enqueue_many("t", [{}] * 2_000, queue="filled")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_relation_size('queue_app_queueitem') / 8192")
        assert 16 < cur.fetchone()[0] < 128  # past today's threshold, below the old one
    assert "queue_app_queueitem" in engine.stale_statistics()
    engine.analyze(["queue_app_queueitem"])
    assert "queue_app_queueitem" not in engine.stale_statistics()
