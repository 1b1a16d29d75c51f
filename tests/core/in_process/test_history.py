"""Partitioned history (engine/history.py, migration 0017): finished items and their reservations move from the
hot tables into day partitions with their ids kept; dead items stay with their dead letters; a requeue brings an
archived item back; retention drops whole days (and deletes rows only for queues keeping less)."""

import datetime as dt
import io
import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from queue_app import engine, services
from queue_app.engine import history, sql
from queue_app.models import DeadLetter, ItemHistory, QueueItem, Reservation, ReservationHistory
from tests.support.history_helpers import age, archive_all, finished
from tests.support.locks import relations_awaited

pytestmark = pytest.mark.django_db(transaction=True)


def columns(table: str) -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s", [table])
        return {row[0] for row in cur.fetchall()}


def test_the_move_names_every_column_of_the_hot_tables():
    assert set(sql.ITEM_FIELDS) == columns("queue_app_queueitem") == columns("queue_app_itemhistory")
    assert set(sql.RESERVATION_FIELDS) | {"not_done_at"} == columns("queue_app_reservation")
    assert columns("queue_app_reservationhistory") == columns("queue_app_reservation") | {"item_finished_at"}


def test_finished_items_move_with_their_reservations_and_keep_their_ids():
    done = finished(5)
    (cancelled,) = engine.enqueue_many("t", [{}])
    services.cancel_items([cancelled])
    (dead,) = engine.enqueue_many("t", [{}], max_attempts=1)
    (held,) = engine.lease(["default"], 1, "w1")
    engine.fail(held, "fatal", retry_in=0)
    (open_item,) = engine.enqueue_many("t", [{}])
    before = {r.id: (r.item_id, r.attempt, r.outcome) for r in Reservation.objects.all()}
    age(done + [cancelled, dead], "2 minutes")

    assert archive_all() == 6

    assert set(ItemHistory.objects.values_list("id", flat=True)) == {*done, cancelled}
    assert set(QueueItem.objects.values_list("id", flat=True)) == {dead, open_item}
    assert DeadLetter.objects.filter(item_id=dead).exists()  # a dead item stays with its letter
    moved = {r.id: (r.item_id, r.attempt, r.outcome) for r in ReservationHistory.objects.all()}
    assert moved == {rid: row for rid, row in before.items() if row[0] in done}
    assert Reservation.objects.filter(item_id__in=done).count() == 0
    row = ItemHistory.objects.get(id=done[0])
    assert (row.state, row.result, row.attempts) == ("done", {"ok": done[0]}, 2)
    for r in ReservationHistory.objects.filter(item_id=done[0]):
        assert r.item_finished_at == row.finished_at
    # Hot and history together: every item and reservation once.
    with connection.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT id) FROM queue_app_item_all")
        assert cur.fetchone() == (8, 8)
        cur.execute("SELECT count(*), count(DISTINCT id) FROM queue_app_reservation_all")
        assert cur.fetchone() == (len(before), len(before))


def test_items_finished_within_the_grace_period_stay_hot():
    ids = finished(3)
    age(ids[:1], "2 minutes")
    assert archive_all(grace=60.0) == 1
    assert set(QueueItem.objects.values_list("id", flat=True)) == set(ids[1:])


def test_a_missing_day_gets_its_partition_when_items_of_that_day_move():
    ids = finished(2)
    age(ids, "20 days")
    day = QueueItem.objects.get(id=ids[0]).finished_at.astimezone(dt.UTC).date()
    assert archive_all() == 2
    assert (f"queue_app_itemhistory_p{day:%Y%m%d}", day) in history.partitions()
    assert (f"queue_app_reservationhistory_p{day:%Y%m%d}", day) in history.partitions()


def test_partitions_are_created_ahead():
    today = dt.datetime.now(dt.UTC).date()
    history.ensure_partitions(2)
    days = {day for _, day in history.partitions()}
    assert {today, today + timedelta(days=1), today + timedelta(days=2)} <= days
    assert history.ensure_partitions(2) == 0  # nothing left to create


def test_requeue_brings_an_archived_cancelled_item_back_with_its_attempts():
    (item,) = engine.enqueue_many("t", [{"x": 1}], max_attempts=3)
    (held,) = engine.lease(["default"], 1, "w1")
    engine.fail(held, "boom", retry_in=0)
    services.cancel_items([item], actor="alice")
    age([item], "2 minutes")
    assert archive_all() == 1
    reservations = set(ReservationHistory.objects.filter(item_id=item).values_list("id", flat=True))
    assert reservations

    assert services.requeue_items([item], actor="alice") == 1

    assert not ItemHistory.objects.filter(id=item).exists()
    back = QueueItem.objects.get(id=item)
    assert (back.state, back.attempts, back.payload) == ("ready", 0, {"x": 1})
    assert set(Reservation.objects.filter(item_id=item).values_list("id", flat=True)) == reservations
    (again,) = engine.lease(["default"], 1, "w1")
    assert again.item_id == item


def test_done_archived_items_are_not_requeued():
    ids = finished(1)
    age(ids, "2 minutes")
    archive_all()
    assert services.requeue_items(ids) == 0
    assert ItemHistory.objects.filter(id__in=ids).count() == 1


def test_retention_drops_whole_days_older_than_the_longest_retention():
    old, recent = finished(4), finished(3)
    age(old, "10 days")
    age(recent, "2 days")
    archive_all()
    old_day = ItemHistory.objects.get(id=old[0]).finished_at.astimezone(dt.UTC).date()

    dropped = history.drop_expired_partitions()  # every queue keeps the default 7 days

    assert f"queue_app_itemhistory_p{old_day:%Y%m%d}" in dropped
    assert f"queue_app_reservationhistory_p{old_day:%Y%m%d}" in dropped
    assert not ItemHistory.objects.filter(id__in=old).exists()
    assert not ReservationHistory.objects.filter(item_id__in=old).exists()
    assert ItemHistory.objects.filter(id__in=recent).count() == 3
    assert ReservationHistory.objects.filter(item_id__in=recent).count() == 6


def test_a_queue_keeping_less_is_pruned_row_by_row():
    engine.ensure_queue("short")
    services.set_queue_options("short", retention=timedelta(days=1))
    short, kept = finished(3, "short"), finished(2)
    age(short + kept, "3 days")
    archive_all()

    assert history.drop_expired_partitions() == []  # the default queue keeps 7 days
    assert history.prune_history() == 3

    assert not ItemHistory.objects.filter(id__in=short).exists()
    assert not ReservationHistory.objects.filter(item_id__in=short).exists()
    assert ItemHistory.objects.filter(id__in=kept).count() == 2


def test_a_queue_keeping_less_than_a_day_is_pruned_row_by_row_even_as_the_longest():
    """Day partitions are the unit of retention: a queue keeping a minute, and no queue keeping more, would keep
    up to a day of history (1.9 GB an hour at 1,400 items/s). Its rows older than its retention go row by row,
    the partitions' dead rows are then the vacuum unit's, and a queue keeping a day or more waits for its day."""
    from queue_app.engine import maintenance

    engine.ensure_queue("default")
    services.set_queue_options("default", retention=timedelta(seconds=60))
    engine.ensure_queue("daily")
    services.set_queue_options("daily", retention=timedelta(days=2))
    assert history.pruned_by_rows(history.retentions()) == {"default": 60.0}  # "daily" is the longest
    services.set_queue_options("daily", retention=timedelta(seconds=30))
    assert history.pruned_by_rows(history.retentions()) == {"default": 60.0, "daily": 30.0}
    services.set_queue_options("daily", retention=timedelta(days=1))

    old, recent, daily = finished(4), finished(2), finished(3, "daily")
    age(old + daily, "5 minutes")
    archive_all(grace=0)

    today = f"{dt.datetime.now(dt.UTC):%Y%m%d}"
    assert not any(t.endswith(today) for t in history.drop_expired_partitions())  # nobody's day has passed
    assert history.prune_history() == 4
    assert not ItemHistory.objects.filter(id__in=old).exists()
    assert not ReservationHistory.objects.filter(item_id__in=old).exists()
    assert ItemHistory.objects.filter(id__in=recent + daily).count() == 5
    assert ReservationHistory.objects.filter(item_id__in=recent + daily).count() == 10
    assert history.prune_history() == 0

    wanted = {f"queue_app_itemhistory_p{today}", f"queue_app_reservationhistory_p{today}"}
    deadline = time.monotonic() + 10  # the statistics collector is told at the deleting session's next idle
    while not wanted <= set(found := maintenance.bloated_tables(min_dead=1, share=0.0)):
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def test_the_worker_maintenance_archives_and_keeps_partitions(settings):
    from queue_app.worker.maintenance import Maintenance, default_units

    settings.JOBSITE = {"ARCHIVE_AFTER": 0.0}
    ids = finished(3)
    units = [u for u in default_units(scheduler=False) if u.name in ("archive", "history_retention")]
    for unit in units:  # in the maintenance thread, which the two take in turn
        Maintenance([unit]).run_due()
        unit.run.join(30)
    assert ItemHistory.objects.filter(id__in=ids).count() == 3
    assert dt.datetime.now(dt.UTC).date() + timedelta(days=2) in {day for _, day in history.partitions()}


def test_the_archive_runs_in_the_maintenance_thread_and_the_loop_does_not_wait_for_it(settings):
    """A batch moved into the history is ~0.1 s of statement at 5,000 items, and longer when it waits on a lock;
    in the supervisor's loop, leases and hand-overs waited with it. The unit's round returns at once while its
    batch waits on the server (here on a lock the history's insert needs), in the thread's own transaction;
    once the lock goes, the batch moves the items."""
    import psycopg

    from queue_app.worker.maintenance import Maintenance, default_units

    settings.JOBSITE = {"ARCHIVE_AFTER": 0.0}
    history.ensure_partitions()  # the move waits, not a creation (which would not wait: migration 0041)
    ids = finished(3)
    unit = next(u for u in default_units(scheduler=False) if u.name == "archive")
    with psycopg.connect(**connection.get_connection_params()) as blocker:
        blocker.execute("LOCK TABLE queue_app_itemhistory IN SHARE MODE")  # no insert until it commits

        def waiting() -> list[str]:  # by the relations it waits for (its query text can be an older statement's)
            return relations_awaited(blocker.info.backend_pid)

        Maintenance([unit]).run_due()  # returns: the batch runs in the maintenance thread
        deadline = time.monotonic() + 1.5  # within the move's lock timeout (2 s)
        while not (blocked := waiting()):
            assert time.monotonic() < deadline, "the archive's batch should be waiting on the lock"
            time.sleep(0.02)
        assert unit.run.busy() and any("history" in q for q in blocked), blocked  # the partition or the move
        assert QueueItem.objects.filter(id__in=ids).count() == 3  # nothing moved yet
        blocker.rollback()
    unit.run.join(30)
    assert not unit.run.busy()
    if QueueItem.objects.filter(id__in=ids).exists():  # a slow machine: the batch gave up at its lock timeout
        unit.due_at = 0.0
        Maintenance([unit]).run_due()
        unit.run.join(30)
    assert ItemHistory.objects.filter(id__in=ids).count() == 3 and not QueueItem.objects.filter(id__in=ids).exists()


def test_a_stopping_worker_waits_for_its_maintenance_thread_before_it_says_it_stopped(settings):
    """An embedded worker (a burst run in a test or in an adopter's process) returned while its maintenance
    thread still archived, its transaction open beside the caller's next statements: a test's reset after it
    deadlocked with such a batch (CI, three test workers). Forced: a lock the archive's insert needs is held from
    before the worker starts until after it has said "worker stopped"; at that line no thread of the worker may
    still be running, so the batch has ended (here at its lock timeout, moving nothing) before the line."""
    import logging

    import psycopg

    from queue_app.worker import Supervisor, WorkerOptions
    from queue_app.worker.maintenance import Maintenance, default_units

    settings.JOBSITE = {"ARCHIVE_AFTER": 0.0}
    history.ensure_partitions()
    ids = finished(3)
    at_stop: list[list[str]] = []

    class AtStop(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("worker stopped"):
                at_stop.append([t.name for t in threading.enumerate() if t.name == "jobsite-archive"])

    handler, log = AtStop(), logging.getLogger("jobsite.worker")
    log.addHandler(handler)
    try:
        with psycopg.connect(**connection.get_connection_params()) as blocker:
            blocker.execute("LOCK TABLE queue_app_itemhistory IN SHARE MODE")  # no insert until it ends
            options = WorkerOptions(pool="thread", concurrency=1, burst=True, poll_interval=0.05, scheduler=False)
            worker = Supervisor(options)
            worker.maintenance = Maintenance([u for u in default_units(scheduler=False) if u.name == "archive"])
            assert worker.run() == 0
            blocker.rollback()
    finally:
        log.removeHandler(handler)
    assert at_stop == [[]], at_stop  # said once, with the archive's thread gone
    assert QueueItem.objects.filter(id__in=ids).count() == 3  # its batch gave up at the lock: nothing lost


def test_a_turn_that_leaves_a_backlog_makes_the_archive_due_again_at_once(settings, monkeypatch):
    """A turn of the archive ends after its time (here after one batch of 2); with more left the unit is due
    again at once instead of `every` seconds later, and the turn that empties the backlog leaves it due in its
    interval."""
    from queue_app.worker import maintenance
    from queue_app.worker.maintenance import Maintenance

    settings.JOBSITE = {"ARCHIVE_AFTER": 0.0}
    monkeypatch.setattr(maintenance, "ARCHIVE_BATCH", 2)
    ids = finished(5)
    unit = next(u for u in maintenance.default_units(scheduler=False) if u.name == "archive")
    unit.run.turn = 0.0
    archived = []
    for _ in range(3):
        Maintenance([unit]).run_due()
        unit.run.join(30)
        archived.append(ItemHistory.objects.filter(id__in=ids).count())
        if archived[-1] < 5:
            assert unit.due_at == 0.0, (archived, unit.due_at)  # due again now: a backlog
    assert archived == [2, 4, 5]
    assert unit.due_at > time.monotonic(), "the last turn found no more: due in its interval"


def test_a_unit_that_found_the_maintenance_thread_busy_comes_again_within_a_second():
    """All units are due as a worker starts and take the one maintenance thread in turn: history_retention, behind
    prune_done's first turn, used to wait its whole interval (30 s). A turn skipped because the thread is busy
    makes the unit due again within SKIPPED_AGAIN; once the thread is free, it runs and is due in its interval."""
    import threading

    from queue_app.worker import maintenance
    from queue_app.worker.maintenance import Maintenance

    units = {u.name: u for u in maintenance.default_units(scheduler=False)}
    prune, retention = units["prune_done"], units["history_retention"]
    release = threading.Event()
    prune.run.batch = lambda: (release.wait(30), ({}, False))[1]  # holds the shared thread until released
    Maintenance([prune]).run_due()
    assert prune.run.busy()
    Maintenance([retention]).run_due()
    assert retention.run.busy() and retention.due_at <= time.monotonic() + maintenance.SKIPPED_AGAIN
    release.set()
    prune.run.join(30)
    retention.due_at = 0.0
    Maintenance([retention]).run_due()
    retention.run.join(30)
    assert retention.due_at > time.monotonic() + maintenance.SKIPPED_AGAIN  # it ran: due in its interval


def test_the_history_unit_comes_every_half_of_the_shortest_row_by_row_retention():
    """Every 30 s with every queue on its days; a queue keeping 2 s (pruned row by row) has it every second (its
    floor), one keeping 40 s every 20 s; a shorter interval holds from the turn that found it, not 30 s later, a
    longer one from the next turn; back to 30 s once no queue keeps less."""
    from queue_app.worker import maintenance
    from queue_app.worker.maintenance import Maintenance

    unit = next(u for u in maintenance.default_units(scheduler=False) if u.name == "history_retention")

    def turn() -> float:
        unit.due_at = 0.0
        Maintenance([unit]).run_due()
        unit.run.join(30)
        return unit.due_at - time.monotonic()

    engine.ensure_queue("default")
    assert unit.every == maintenance.HISTORY_EVERY == 30.0 and 29 < turn() <= 30
    services.set_queue_options("default", retention=timedelta(seconds=2))
    left = turn()
    assert unit.every == maintenance.HISTORY_EVERY_LEAST == 1.0 and 0 < left <= 1.0, left
    services.set_queue_options("default", retention=timedelta(seconds=40))
    turn()  # due again in the interval it was due in (1 s); the longer one counts from the next turn
    assert 19 < turn() <= 20 and unit.every == 20.0
    services.set_queue_options("default", retention=timedelta(days=7))
    turn()
    assert unit.every == 30.0


def test_the_migration_moves_finished_data_of_the_old_layout():
    """Back to 0016 (the old layout, no history tables), rows of every state written there, then forward: the
    done and cancelled items without a dead letter are in history with their reservations, the rest stays."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    leaf = executor.loader.graph.leaf_nodes()  # every app: the layer apps' 0001 build on queue_app 0047
    executor.migrate([("queue_app", "0016_spark_connect_server")])
    try:
        assert "queue_app_itemhistory" not in connection.introspection.table_names()
        with connection.cursor() as cur:
            cur.execute(
                """
                INSERT INTO queue_app_queue (name, paused, lease_timeout, max_attempts, retention, created_at, fair)
                VALUES ('old', false, 60, 5, interval '7 days', now(), false);
                INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at,
                    attempts, max_attempts, error, created_at, updated_at, finished_at)
                SELECT g, 'old', 't', jsonb_build_object('n', g),
                       (ARRAY['done', 'cancelled', 'dead', 'ready', 'done'])[1 + g % 5], 0, now(), now(), 1, 5, '',
                       now() - interval '3 days', now(), CASE WHEN g % 5 <> 3 THEN now() - g * interval '1 hour' END
                FROM generate_series(1, 100) g;
                INSERT INTO queue_app_reservation (id, item_id, attempt, worker_id, reserved_at, lease_expires_at,
                    heartbeat_at, finished_at, outcome, error, traceback)
                SELECT 1000 + g, g, 1, 'w', now() - interval '3 days', now(), now(), now(), 'done', '', ''
                FROM generate_series(1, 100) g;
                INSERT INTO queue_app_deadletter (item_id, reason, last_error, died_at, requeued_by)
                SELECT g, 'x', '', now(), '' FROM generate_series(2, 100, 5) g;
                -- a done item that died once and was requeued keeps its (requeued) letter, so it stays
                INSERT INTO queue_app_deadletter (item_id, reason, last_error, died_at, requeued_at, requeued_by)
                VALUES (5, 'x', '', now(), now(), 'bob');
                """
            )
        executor = MigrationExecutor(connection)
        executor.migrate(leaf)
        movable = {g for g in range(1, 101) if g % 5 in (0, 1, 4) and g != 5}  # done, cancelled; not 5
        with connection.cursor() as cur:
            cur.execute("SELECT id FROM queue_app_itemhistory")
            assert {row[0] for row in cur.fetchall()} == movable
            cur.execute("SELECT id FROM queue_app_queueitem")
            assert {row[0] for row in cur.fetchall()} == set(range(1, 101)) - movable
            cur.execute("SELECT item_id FROM queue_app_reservationhistory")
            assert {row[0] for row in cur.fetchall()} == movable
            cur.execute("SELECT count(*) FROM queue_app_reservation")
            assert cur.fetchone()[0] == 100 - len(movable)
            cur.execute("SELECT payload FROM queue_app_itemhistory WHERE id = 4")
            assert json.loads(cur.fetchone()[0]) == {"n": 4}
            # each moved row is in the partition of its finished day (up to 100 hours back: several days)
            cur.execute(
                "SELECT count(DISTINCT tableoid) > 1, bool_and(tableoid::regclass::text ="
                " 'queue_app_itemhistory_p' || to_char(finished_at AT TIME ZONE 'UTC', 'YYYYMMDD'))"
                " FROM queue_app_itemhistory"
            )
            assert cur.fetchone() == (True, True)
    finally:
        MigrationExecutor(connection).migrate(leaf)


def test_overview_metrics_and_queue_stats_count_archived_items(client):
    from django.core.management import call_command
    from prometheus_client.parser import text_string_to_metric_families

    from queue_app.monitoring import snapshot

    ids = finished(4)
    age(ids[:3], "2 minutes")
    archive_all()
    assert ItemHistory.objects.count() == 3

    (queue,) = [q for q in snapshot().queues if q.name == "default"]
    assert queue.depth["done"].value == 4  # 3 archived + 1 hot
    assert queue.processed == 4  # done within the window, wherever they are
    assert queue.failed == 4  # each item's first attempt failed
    response = client.get("/metrics")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    assert samples["jobsite_queue_depth", (("queue", "default"), ("state", "done"))] == 4
    out = io.StringIO()
    call_command("queue_stats", "--json", stdout=out)
    (row,) = [r for r in json.loads(out.getvalue())["queues"] if r["queue"] == "default"]
    assert row["done"] == 4


def test_a_django_task_result_is_found_after_its_item_moved():
    from django.tasks import default_task_backend

    from tests.tasks.django_tasks_app import add

    result = add.enqueue(2, 3)
    (held,) = engine.lease(["default"], 1, "w1")
    engine.complete(held, 5)
    age([held.item_id], "2 minutes")
    assert archive_all() == 1
    fetched = default_task_backend.get_result(result.id)
    assert (fetched.status.value, fetched.return_value, fetched.args) == ("SUCCESSFUL", 5, [2, 3])


def test_a_duplicate_enqueue_names_its_archived_owner():
    first = engine.enqueue("t", {}, dedup_key="order-7")
    (held,) = engine.lease(["default"], 1, "w1")
    engine.complete(held, None)
    age([first.id], "2 minutes")
    assert archive_all() == 1
    again = engine.enqueue("t", {}, dedup_key="order-7")
    assert (again.id, again.duplicate, again.run_at) == (first.id, True, first.run_at)


def test_a_webhook_delivery_reads_its_archived_item():
    from queue_app.webhooks import services as webhooks
    from queue_app.webhooks.events import publish_event

    webhooks.create_endpoint("https://example.com/hook", ["test"])
    (delivery,) = publish_event("test", {})
    services.cancel_items([delivery.item_id])
    age([delivery.item_id], "2 minutes")
    assert archive_all() == 1
    assert webhooks.delivery_states([delivery]) == {delivery.id: "cancelled"}


def test_no_statement_of_the_hot_path_reads_the_history():
    """Lease and settle cost the same whatever the history holds: none of their statements names it."""
    hot_path = ("LEASE", "LEASE_FAIR", "SETTLE_AND_LEASE", "COMPLETE_MANY", "COMPLETE_ONE", "FAIL", "EXTEND_MANY")
    hot_path += ("EXTEND_ONE", "RELEASE")
    hot_path += ("RENEW_LEASES", "START_AT_MOST_ONCE", "ENQUEUE", "ENQUEUE_DEDUP", "RESCUE_EXPIRED", "LOCK_RESERVED")
    for name in hot_path:
        text = getattr(sql, name)
        assert sql.ITEM_HISTORY not in text and sql.RESERVATION_HISTORY not in text, name


def test_partition_ddl_waits_briefly_for_a_reader_then_is_done_next_round():
    """Creating or dropping a partition needs the parent tables to itself: behind a reader it gives up after the
    lock timeout (nothing fails, nothing queues behind it), and the next round does it."""
    import psycopg

    from queue_app.worker.maintenance import Maintenance, default_units

    old = finished(2)
    age(old, "10 days")
    archive_all()
    for table, day in history.partitions():  # the coming days' partitions are missing too
        if day > dt.datetime.now(dt.UTC).date():
            with connection.cursor() as cur:
                cur.execute(f'DROP TABLE "{table}"')
    unit = next(u for u in default_units(scheduler=False) if u.name == "history_retention")
    with psycopg.connect(**connection.get_connection_params()) as reader:
        reader.execute("SELECT count(*) FROM queue_app_itemhistory").fetchone()  # holds its lock until commit
        Maintenance([unit]).run_due()
        unit.run.join(30)  # the maintenance thread's turn
        assert ItemHistory.objects.filter(id__in=old).count() == 2
        assert max(day for _, day in history.partitions()) <= dt.datetime.now(dt.UTC).date()
    unit.due_at = 0.0
    Maintenance([unit]).run_due()
    unit.run.join(30)
    assert not ItemHistory.objects.filter(id__in=old).exists()
    assert dt.datetime.now(dt.UTC).date() + timedelta(days=2) in {day for _, day in history.partitions()}


def test_the_prune_task_drops_expired_days_too():
    from queue_app.maintenance_tasks import prune

    old = finished(2)
    age(old, "10 days")
    archive_all()
    counts = prune(None, None)
    assert counts["partitions_dropped"] == 2  # the day's item and reservation partitions
    assert not ItemHistory.objects.filter(id__in=old).exists()
