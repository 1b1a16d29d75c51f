"""Every item names an existing queue, and a queue with items stays. The item table has no foreign-key constraint
to the queue table (its per-row check was ~30% of a bulk enqueue); the triggers of migration 0008 keep the same
rule once per statement. These tests break it every way there is — ORM, plain SQL, COPY, an update, a delete and
a rename, and a delete racing an insert on two connections — and find it kept."""

import threading

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from queue_app import engine
from queue_app.models import Queue, QueueItem
from tests.support.queue_helpers import lock_waiters, raw_connection
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def item_sql(queue: str) -> str:
    return (
        "INSERT INTO queue_app_queueitem (queue_id, task, payload, state, priority, attempts, max_attempts, error)"
        f" VALUES ('{queue}', 't', '{{}}', 'ready', 0, 0, 5, '')"
    )


def test_an_item_naming_a_missing_queue_is_refused_through_the_orm():
    with pytest.raises(IntegrityError, match="names queue 'nowhere', which does not exist"):
        QueueItem.objects.create(queue_id="nowhere", task="t")

    assert not QueueItem.objects.exists()


def test_one_missing_queue_refuses_the_whole_statement():
    engine.ensure_queue("here")
    with connection.cursor() as cur, pytest.raises(IntegrityError, match="'nowhere'"):
        cur.execute(
            "INSERT INTO queue_app_queueitem (queue_id, task, payload, state, priority, attempts, max_attempts, error)"
            " SELECT q, 't', '{}', 'ready', 0, 0, 5, '' FROM unnest(ARRAY['here', 'nowhere', 'here']) AS q"
        )

    assert not QueueItem.objects.exists()


def test_copy_into_a_missing_queue_is_refused():
    with raw_connection() as conn, pytest.raises(psycopg.errors.ForeignKeyViolation):
        columns = "queue_id, task, payload, state, priority, attempts, max_attempts, error"
        with conn.cursor().copy(f"COPY queue_app_queueitem ({columns}) FROM STDIN") as cp:
            cp.write_row(("nowhere", "t", "{}", "ready", 0, 0, 5, ""))

    assert not QueueItem.objects.exists()


def test_enqueue_creates_the_queue_it_names_in_the_same_statement():
    single = engine.enqueue("t", queue="fresh-1")
    deduped = engine.enqueue("t", queue="fresh-2", dedup_key="k")
    bulk = engine.enqueue_many("t", [{}] * 3, queue="fresh-3")

    assert set(Queue.objects.values_list("name", flat=True)) == {"fresh-1", "fresh-2", "fresh-3"}
    assert QueueItem.objects.filter(id__in=[single.id, deduped.id, *bulk]).count() == 5


def test_an_item_cannot_move_to_a_missing_queue_but_may_move_to_another():
    item = QueueItem.objects.get(id=engine.enqueue("t", queue="a").id)
    engine.ensure_queue("b")

    item.queue_id = "nowhere"
    with pytest.raises(IntegrityError, match="moved to queue 'nowhere'"), transaction.atomic():
        item.save()
    item.queue_id = "b"
    item.save()

    assert QueueItem.objects.get(id=item.id).queue_id == "b"


@pytest.mark.parametrize("state", ["ready", "done"])
def test_a_queue_with_items_cannot_be_deleted_or_renamed(state):
    item = engine.enqueue("t", queue="busy")
    QueueItem.objects.filter(id=item.id).update(state=state)

    with pytest.raises(IntegrityError, match="'busy' still has items"), transaction.atomic():
        Queue.objects.filter(name="busy").delete()
    with pytest.raises(IntegrityError, match="'busy' still has items"), transaction.atomic():
        Queue.objects.filter(name="busy").update(name="renamed")

    assert Queue.objects.filter(name="busy").exists()


def test_an_empty_queue_can_be_deleted_and_renamed():
    engine.ensure_queue("idle")
    engine.ensure_queue("gone")

    Queue.objects.filter(name="idle").update(name="renamed")
    Queue.objects.filter(name="gone").delete()

    assert list(Queue.objects.values_list("name", flat=True)) == ["renamed"]


def run_behind(holder: psycopg.Connection, statement: str) -> BaseException | None:
    """Run `statement` on a connection of its own while `holder`'s open transaction holds the lock it needs:
    wait until it waits on that lock, commit `holder`, and return what the statement then raised (None: it
    committed)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        with raw_connection() as conn:
            try:
                conn.execute(statement)
                conn.commit()
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: lock_waiters(statement) == 1, timeout=10, what=f"{statement!r} to wait on a lock")
    holder.commit()
    thread.join(10)
    return outcome[0]


def test_a_queue_delete_waits_for_an_open_enqueue_and_then_sees_its_items():
    engine.ensure_queue("raced")

    with raw_connection() as enqueuer:
        enqueuer.execute(item_sql("raced"))  # its statement trigger locks the queue row until commit
        outcome = run_behind(enqueuer, "DELETE FROM queue_app_queue WHERE name = 'raced'")

    assert isinstance(outcome, psycopg.errors.ForeignKeyViolation)
    assert QueueItem.objects.filter(queue_id="raced").count() == 1
    assert Queue.objects.filter(name="raced").exists()


def test_an_insert_racing_a_queue_delete_is_refused_when_the_delete_commits():
    engine.ensure_queue("raced")

    with raw_connection() as deleter:
        assert deleter.execute("DELETE FROM queue_app_queue WHERE name = 'raced'").rowcount == 1
        outcome = run_behind(deleter, item_sql("raced"))

    assert isinstance(outcome, psycopg.errors.ForeignKeyViolation)
    assert not QueueItem.objects.exists()
    assert not Queue.objects.filter(name="raced").exists()


def _enqueue_behind_a_delete(*, commit: bool) -> QueueItem:
    """engine.enqueue() into 'raced' (max_attempts 9) on a thread (its own connection) while another connection's
    open transaction has deleted the queue; once the enqueue is seen waiting for the queue row, the delete commits
    (or rolls back). Returns the enqueued item; the enqueue must not raise."""
    engine.ensure_queue("raced")
    Queue.objects.filter(name="raced").update(max_attempts=9)
    done: list = []
    errors: list = []

    def run() -> None:
        try:
            done.append(engine.enqueue("t", {"n": 1}, queue="raced"))
        except BaseException as exc:  # noqa: BLE001 - asserted below: there is none
            errors.append(exc)
        finally:
            connection.close()

    with raw_connection() as deleter:
        assert deleter.execute("DELETE FROM queue_app_queue WHERE name = 'raced'").rowcount == 1
        thread = threading.Thread(target=run)
        thread.start()
        wait_for(lambda: lock_waiters("\nWITH qr AS") == 1, timeout=10, what="the enqueue to wait for the queue row")
        deleter.commit() if commit else deleter.rollback()
        thread.join(10)
    assert errors == [] and len(done) == 1
    return QueueItem.objects.get(pk=done[0].id)


def test_an_enqueue_waits_for_a_queue_delete_and_then_creates_the_queue_again():
    """The enqueue reads its queue row once, locked (sql._ENQUEUE): a DELETE of the queue open when it arrives is
    waited for, and once it commits the queue is missing, so the enqueue creates it with the defaults, as the
    upsert it replaced did. Forced: the deleter holds the row until the enqueue waits on it."""
    item = _enqueue_behind_a_delete(commit=True)

    recreated = Queue.objects.get(name="raced")
    assert recreated.max_attempts != 9 and item.max_attempts == recreated.max_attempts


def test_an_enqueue_behind_a_queue_delete_that_rolls_back_takes_the_queue_as_it_is():
    item = _enqueue_behind_a_delete(commit=False)

    assert item.max_attempts == 9
    assert Queue.objects.filter(name="raced").count() == 1


def _move_sql(item_id: int, queue: str) -> str:
    return f"UPDATE queue_app_queueitem SET queue_id = '{queue}' WHERE id = {item_id}"


def test_a_move_racing_a_queue_delete_is_refused_when_the_delete_commits():
    """The move's check (item_queue_moved) runs after the row's update (migration 0051): it then waits for the open
    delete of the queue it names, finds the queue gone and refuses the move. Forced: the deleter holds the queue
    row until the move waits on it."""
    item = engine.enqueue("t", queue="a")
    engine.ensure_queue("b")

    with raw_connection() as deleter:
        assert deleter.execute("DELETE FROM queue_app_queue WHERE name = 'b'").rowcount == 1
        outcome = run_behind(deleter, _move_sql(item.id, "b"))

    assert isinstance(outcome, psycopg.errors.ForeignKeyViolation) and "moved to queue 'b'" in str(outcome)
    assert QueueItem.objects.get(id=item.id).queue_id == "a"


def test_a_queue_delete_waits_for_an_open_move_and_then_sees_the_moved_item():
    item = engine.enqueue("t", queue="a")
    engine.ensure_queue("b")

    with raw_connection() as mover:
        mover.execute(_move_sql(item.id, "b"))  # its trigger locks the queue row 'b' until commit
        outcome = run_behind(mover, "DELETE FROM queue_app_queue WHERE name = 'b'")

    assert isinstance(outcome, psycopg.errors.ForeignKeyViolation) and "'b' still has items" in str(outcome)
    assert QueueItem.objects.get(id=item.id).queue_id == "b"


def test_no_update_of_an_item_locks_its_row_before_writing_it():
    """A BEFORE ROW UPDATE trigger on the item table, whatever its columns or WHEN, makes PostgreSQL lock every row
    an UPDATE changes before changing it: one more WAL record (50-60 bytes) and buffer write for each item a
    worker settles (migration 0051). The item table's row triggers on UPDATE are AFTER triggers."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT tgname FROM pg_trigger WHERE tgrelid = 'queue_app_queueitem'::regclass AND NOT tgisinternal
               AND tgtype & 1 = 1 AND tgtype & 2 = 2 AND tgtype & 16 = 16"""  # ROW, BEFORE, UPDATE (pg_trigger.h)
        )
        before_update = [name for (name,) in cur.fetchall()]
        cur.execute(
            """SELECT count(*) FROM pg_trigger WHERE tgrelid = 'queue_app_queueitem'::regclass AND NOT tgisinternal
               AND tgname = 'item_queue_moved' AND tgtype & 2 = 0"""
        )
        after_moved = cur.fetchone()[0]

    assert before_update == [] and after_moved == 1
