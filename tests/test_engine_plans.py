"""A worker's own connection keeps generic plans (sql.WORKER_SESSION): every statement it runs is planned once,
whatever the parameters, so each must stay index work on large tables when planned without them (LIMIT by a
parameter is estimated at 10% of the rows). Checked on tables of tens of thousands of ready, done and attempted
rows; and the session settings: applied, kept over a reconnect, undone, never leaked to other connections."""

import re
import threading

import pytest
from django.db import connection, transaction

from queue_app import engine
from queue_app.engine import sql
from queue_app.models import QueueItem
from queue_app.worker import Supervisor, WorkerOptions

BIG = ("queue_app_queueitem", "queue_app_reservation")
# Run by maintenance units, under TRY_MAINTENANCE_LOCK, which plans them per call again (plan_cache_mode auto).
MAINTENANCE = {"PRUNE_DONE", "PRUNE_DEDUP", "RESCUE_EXPIRED", "SWEEP_WORKERS", "BLOATED_TABLES"}
# Not planned statements: COPY, VACUUM, the session settings.
NOT_PLANNED = {"COPY_ITEMS", "VACUUM", "WORKER_SESSION", "DEFAULT_SESSION"}


def statements() -> dict[str, str]:
    return {
        name: text
        for name, text in vars(sql).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(text, str)
        and " " in text.strip()
        and name not in NOT_PLANNED  # (the upper-case names without a space are table names)
    }


def _positional(text: str) -> tuple[str, int]:
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text).replace("{table}", "queue_app_queueitem"), len(names)


def generic_plan(cur, text: str) -> list[str]:
    positional, n = _positional(text)
    cur.execute("DEALLOCATE ALL")
    cur.execute("PREPARE planned AS " + positional)
    cur.execute("EXPLAIN EXECUTE planned(" + ", ".join(["NULL"] * n) + ")")
    return [row[0] for row in cur.fetchall()]


def large_tables() -> None:
    """40,000 ready items in a paused queue, 20,000 done items with a reservation each, statistics fresh."""
    engine.enqueue_many("t", [{}] * 40_000, queue="backlog")
    engine.enqueue_many("t", [{}] * 20_000, queue="history")
    done: list = []
    while True:
        out = engine.settle_and_lease([(h, None) for h in done], ["history"], 5_000, "w1", 600)
        if not (done := out.leases):
            break
    with connection.cursor() as cur:
        cur.execute("UPDATE queue_app_queue SET paused = true WHERE name = 'backlog'")
        for table in BIG:
            cur.execute(f"VACUUM ANALYZE {table}")


def generic_plans(texts: dict[str, str]) -> dict[str, list[str]]:
    with connection.cursor() as cur:
        cur.execute(sql.WORKER_SESSION)
        try:
            return {name: generic_plan(cur, text) for name, text in texts.items()}
        finally:
            cur.execute("DEALLOCATE ALL")
            cur.execute(sql.DEFAULT_SESSION)


def scans_of_large_tables(plan: list[str]) -> list[str]:
    return [line.strip() for line in plan if "Seq Scan" in line and any(t in line for t in BIG)]


@pytest.mark.django_db(transaction=True)
def test_every_statement_of_a_workers_connection_has_a_generic_plan_without_scans_of_the_large_tables():
    large_tables()
    checked = {name: text for name, text in statements().items() if name not in MAINTENANCE}
    assert {"SETTLE_AND_LEASE", "LEASE", "COMPLETE_MANY", "FAIL", "RENEW_LEASES"} <= checked.keys()

    plans = generic_plans(checked)

    assert {name: scans_of_large_tables(plan) for name, plan in plans.items() if scans_of_large_tables(plan)} == {}
    # The check would see one: what the lease's `= ANY(array(...))` guards against (an update joined to a CTE
    # alone, LIMIT by parameter).
    naive = """WITH picked AS (SELECT id FROM queue_app_queueitem WHERE state = 'ready' LIMIT %(n)s)
               UPDATE queue_app_queueitem i SET updated_at = now() FROM picked WHERE i.id = picked.id"""
    assert scans_of_large_tables(generic_plans({"naive": naive})["naive"])


def settings() -> tuple[str, str]:
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('plan_cache_mode'), current_setting('jit')")
        return cur.fetchone()


def other_threads_settings() -> tuple[str, str]:
    seen = []

    def look():
        try:
            seen.append(settings())
        finally:
            connection.close()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    return seen[0]


@pytest.mark.django_db(transaction=True)
def test_keep_generic_plans_tunes_this_threads_connection_again_after_a_reconnect_and_undoes():
    before = settings()
    undo = engine.keep_generic_plans()
    try:
        assert settings() == ("force_generic_plan", "off")
        assert other_threads_settings() == before  # a handler thread's connection keeps the defaults
        connection.close()
        assert settings() == ("force_generic_plan", "off")  # reconnected, tuned again
        with transaction.atomic():
            assert engine.try_maintenance_lock("plans-test")
            assert settings()[0] == "auto"  # maintenance statements are planned per call
        assert settings()[0] == "force_generic_plan"
    finally:
        undo()
    assert settings() == before
    connection.close()
    assert settings() == before  # no longer tuned on reconnect


@pytest.mark.django_db(transaction=True)
def test_a_supervisor_runs_on_generic_plans_and_gives_the_connection_back_as_it_found_it():
    before = settings()
    seen = []
    item = engine.enqueue("queue_app.noop", {})
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=1, burst=True, poll_interval=0.1))
    lease = supervisor._lease

    def spying_lease(now):
        seen.append(settings())
        lease(now)

    supervisor._lease = spying_lease
    assert supervisor.run() == 0
    assert seen and set(seen) == {("force_generic_plan", "off")}
    assert settings() == before
    assert QueueItem.objects.get(id=item.id).state == "done"
