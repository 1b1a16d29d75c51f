"""The SQL API from a plain psycopg connection (no Django on the calling side): jobsite_enqueue joins the
caller's transaction with the Python enqueue's validation, defaults, dedup and NOTIFY; the example consumer
(docs/examples/sql_consumer.py) leases and settles with fencing by reservation id."""

import importlib.util
import json

import psycopg
import pytest
from django.db import connection

import tests.tasks.worker_tasks  # noqa: F401  registers the tasks whose declarations the tests publish
from queue_app import engine, registry
from queue_app.engine import sql_api
from queue_app.models import Queue, QueueItem, Reservation
from tests.support.paths import ROOT
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

spec = importlib.util.spec_from_file_location("sql_consumer", ROOT / "docs" / "examples" / "sql_consumer.py")
sql_consumer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sql_consumer)


@pytest.fixture
def dsn() -> str:
    """The test database's address, for connections that are not Django's."""
    registry.publish_declarations()
    params = connection.get_connection_params()  # only where the database is: no Django adapters or cursors
    return psycopg.conninfo.make_conninfo(
        **{k: params[k] for k in ("dbname", "user", "password", "host", "port") if params.get(k)}
    )


@pytest.fixture
def pg(dsn):
    with psycopg.connect(dsn) as conn:
        yield conn


def enqueue(conn: psycopg.Connection, task: str, payload: str = "{}", **options) -> int:
    named = "".join(f", {name} => %({name})s" for name in options)
    return conn.execute(
        f"SELECT jobsite_enqueue(%(task)s, %(payload)s::jsonb{named})", {"task": task, "payload": payload, **options}
    ).fetchone()[0]


def test_an_enqueue_in_a_transaction_that_rolls_back_leaves_nothing(pg):
    item_id = enqueue(pg, "queue_app.echo", '{"n": 1}', queue="sqlapi-rollback")
    assert pg.execute("SELECT state FROM queue_app_queueitem WHERE id = %s", (item_id,)).fetchone() == ("ready",)
    pg.rollback()
    assert not QueueItem.objects.filter(id=item_id).exists()
    assert not Queue.objects.filter(name="sqlapi-rollback").exists()


def test_the_items_defaults_are_the_python_enqueues(pg):
    """tests.flaky declares 3 attempts (Retry(times=3)): both paths give the item the same queue, attempts,
    priority and due time rules."""
    from_sql = enqueue(pg, "tests.flaky")
    pg.commit()
    from_python = engine.enqueue("tests.flaky").id
    fields = ("queue_id", "task", "max_attempts", "priority", "lease_timeout", "group_key", "state", "payload")
    rows = {
        i["id"]: {f: i[f] for f in fields}
        for i in QueueItem.objects.filter(id__in=[from_sql, from_python]).values("id", *fields)
    }
    assert rows[from_sql] == rows[from_python]
    assert rows[from_sql]["max_attempts"] == 3


def test_a_payload_is_any_json_value_as_in_python_and_null_is_an_empty_object(pg):
    """engine.enqueue() takes any JSON value (None: {}); so does jobsite_enqueue."""
    as_list = enqueue(pg, "queue_app.echo", "[1, 2]")
    as_null = pg.execute("SELECT jobsite_enqueue('queue_app.echo', NULL)").fetchone()[0]
    pg.commit()
    from_python = [engine.enqueue("queue_app.echo", p).id for p in ([1, 2], None)]
    payloads = dict(QueueItem.objects.values_list("id", "payload"))
    assert [payloads[as_list], payloads[as_null]] == [payloads[i] for i in from_python] == [[1, 2], {}]


def test_a_duplicate_inside_the_dedup_window_returns_the_first_id(pg):
    first = enqueue(pg, "queue_app.echo", '{"v": 1}', dedup_key="order-7")
    pg.commit()
    second = enqueue(pg, "queue_app.echo", '{"v": 2}', dedup_key="order-7")
    pg.commit()
    assert second == first
    assert engine.enqueue("queue_app.echo", {"v": 3}, dedup_key="order-7").id == first
    items = QueueItem.objects.filter(task="queue_app.echo")
    assert [(i.id, i.payload) for i in items] == [(first, {"v": 1})]


def test_the_enqueue_notifies_the_queue_at_commit(dsn, pg):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN jobsite_queue")
        enqueue(pg, "queue_app.echo", queue="sqlapi-notify")
        pg.commit()
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=60, stop_after=1)]
    assert got == [("jobsite_queue", "sqlapi-notify")]


DEEP = "[" * 64 + "1" + "]" * 64  # 65 levels with the scalar: one more than MAX_PAYLOAD_DEPTH (64) allows


@pytest.mark.parametrize(
    ("task", "payload", "options", "message"),
    [
        ("no.such.task", "{}", {}, "unknown task: no.such.task"),
        ("", "{}", {}, "task must be a non-empty name"),
        ("x" * 201, "{}", {}, "task must be a non-empty name"),
        ("queue_app.echo", DEEP, {}, "payload nested deeper than 64 levels"),
        ("queue_app.echo", "{}", {"priority": 101}, "priority must be an integer from -100 to 100, not 101"),
        ("queue_app.echo", "{}", {"priority": -101}, "priority must be an integer from -100 to 100, not -101"),
        ("queue_app.echo", "{}", {"queue": "bad queue"}, "queue name must match"),
        ("queue_app.echo", "{}", {"delay": -1.0}, "delay must be a finite number >= 0"),
        ("queue_app.echo", "{}", {"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ("queue_app.echo", "{}", {"lease_timeout": 0.0}, "lease_timeout must be a finite number >= 0.001"),
        ("queue_app.echo", "{}", {"dedup_key": "k", "dedup_window": 0.0}, "dedup_window must be a finite number"),
        ("queue_app.echo", "{}", {"ordering_key": ""}, "must be non-empty strings of at most 200 characters"),
        ("tests.sqlapi_once", "{}", {"max_attempts": 3}, "is an at-most-once task, never retried"),
        ("queue_app.echo", "{}", {"debounce_key": "k"}, "takes both debounce_key and debounce"),
        ("queue_app.echo", "{}", {"debounce_key": "k", "debounce": 0.0}, "debounce must be a finite number"),
        ("queue_app.echo", "{}", {"debounce_key": "k", "debounce": 2.0, "debounce_max": 1.0}, "at least debounce"),
        ("queue_app.echo", "{}", {"debounce_key": "k", "debounce": 1.0, "dedup_key": "d"}, "not both"),
        ("queue_app.echo", "{}", {"debounce_key": "k", "debounce": 1.0, "delay": 5.0}, "not run_at or delay"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(pg, task, payload, options, message):
    sql_api.publish({"tests.sqlapi_once": {"at_most_once": True, "max_attempts": 1}})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        enqueue(pg, task, payload, queue=options.pop("queue", "sqlapi-bad"), **options)
    pg.rollback()
    pg.execute("SELECT 1")  # the connection is usable again
    assert not QueueItem.objects.exists()
    assert not Queue.objects.filter(name__in=["sqlapi-bad", "bad queue"]).exists()


def test_debounced_sql_enqueues_collapse_into_one_item_with_the_latest_payload(pg):
    """The Python enqueue's debounce (the same upsert): three enqueues of a key, one item carrying the third
    payload, two absorbed; an item of another task holding the key refuses the enqueue."""
    ids = [
        enqueue(pg, "queue_app.echo", json.dumps({"n": n}), queue="sqlapi-debounce", debounce_key="k", debounce=60.0)
        for n in range(3)
    ]
    pg.commit()
    assert len(set(ids)) == 1
    item = QueueItem.objects.get(id=ids[0])
    assert (item.payload, item.absorbed, item.debounce_key) == ({"n": 2}, 2, "k")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="held by a ready item of another task"):
        enqueue(pg, "tests.flaky", queue="sqlapi-debounce", debounce_key="k", debounce=60.0)
    pg.rollback()
    assert QueueItem.objects.count() == 1


def test_run_at_and_delay_together_are_refused(pg):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="give run_at or delay, not both"):
        pg.execute("SELECT jobsite_enqueue('queue_app.echo', run_at => now(), delay => 1)")


def test_the_example_consumer_leases_completes_and_a_stale_reservation_changes_nothing(dsn, pg):
    done_id = enqueue(pg, "queue_app.echo", '{"hello": "sql"}', queue="sqlapi-consumer")
    lost_id = enqueue(pg, "queue_app.echo", '{"n": 2}', queue="sqlapi-consumer", priority=-1)
    pg.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert sql_consumer.run_once(conn, "sqlapi-consumer", {"queue_app.echo": lambda t, p: p}, n=1) == 1
        done = QueueItem.objects.get(id=done_id)
        assert (done.state, done.result) == ("done", {"hello": "sql"})
        # A lease that lapses: another consumer takes the item under a new reservation; the first one's
        # settles then change nothing and say so.
        [(stale, item_id, task, payload, attempt)] = sql_consumer.lease(conn, "sqlapi-consumer", 1, 0.001)
        assert (item_id, task, payload, attempt) == (lost_id, "queue_app.echo", {"n": 2}, 1)
        [(current, item_id, *_, attempt)] = wait_for(
            lambda: sql_consumer.lease(conn, "sqlapi-consumer", 1, 60), 60, what="the lapsed lease taken again"
        )
        assert (item_id, attempt) == (lost_id, 2)
        assert sql_consumer.complete(conn, stale, {"late": True}) is False
        assert sql_consumer.fail(conn, stale, "late") is False
        assert QueueItem.objects.get(id=lost_id).state == "reserved"
        assert sql_consumer.fail(conn, current, "boom", retry_in=0) is True
        failed = QueueItem.objects.get(id=lost_id)
        assert (failed.state, failed.error) == ("ready", "boom")
        [(again, *_)] = wait_for(lambda: sql_consumer.lease(conn, "sqlapi-consumer", 1), 60, what="the retry")
        assert sql_consumer.complete(conn, again, [1, 2]) is True
        assert sql_consumer.complete(conn, current, None) is False
    assert QueueItem.objects.get(id=lost_id).result == [1, 2]


def test_a_repeated_complete_returns_true_and_changes_nothing_an_unknown_reservation_false(pg):
    """A retry of a complete whose reply was lost: `true` again, the first result and end kept."""
    item_id = enqueue(pg, "queue_app.echo", queue="sqlapi-repeat")
    pg.commit()
    [(reservation,)] = pg.execute("SELECT reservation_id FROM jobsite_lease('sqlapi-repeat', 1, 30)").fetchall()
    pg.commit()
    complete = "SELECT jobsite_complete(%s, %s::jsonb)"
    assert pg.execute(complete, [reservation, '{"first": 1}']).fetchone()[0] is True
    pg.commit()
    first = Reservation.objects.get(id=reservation)
    assert pg.execute(complete, [reservation, '{"second": 2}']).fetchone()[0] is True
    pg.commit()
    item, again = QueueItem.objects.get(id=item_id), Reservation.objects.get(id=reservation)
    assert (item.state, item.result) == ("done", {"first": 1})
    assert (again.outcome, again.finished_at) == ("done", first.finished_at)
    assert pg.execute(complete, [reservation + 1_000_000, "{}"]).fetchone()[0] is False  # no such reservation
    assert pg.execute("SELECT jobsite_fail(%s, 'late')", [reservation]).fetchone()[0] is False  # done: not failed
    pg.commit()
    assert QueueItem.objects.get(id=item_id).state == "done"


def test_a_paused_or_unknown_queue_leases_nothing_and_takes_nothing(pg):
    item_id = enqueue(pg, "queue_app.echo", queue="sqlapi-paused")
    pg.commit()
    Queue.objects.filter(name="sqlapi-paused").update(paused=True)
    assert pg.execute("SELECT * FROM jobsite_lease('sqlapi-paused', 5, 30)").fetchall() == []
    assert pg.execute("SELECT * FROM jobsite_lease('sqlapi-no-such-queue', 5, 30)").fetchall() == []
    pg.commit()
    item = QueueItem.objects.get(id=item_id)
    assert (item.state, item.attempts, item.reservation_id) == ("ready", 0, None)
    assert not Queue.objects.filter(name="sqlapi-no-such-queue").exists()
    Queue.objects.filter(name="sqlapi-paused").update(paused=False)  # resumed: the same call takes it
    [(leased,)] = pg.execute("SELECT item_id FROM jobsite_lease('sqlapi-paused', 5, 30)").fetchall()
    assert leased == item_id


def test_a_flow_controlled_queue_is_refused_by_the_sql_lease(pg):
    engine.ensure_queue("sqlapi-limited")
    Queue.objects.filter(name="sqlapi-limited").update(concurrency_limit=1)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="under flow control"):
        pg.execute("SELECT * FROM jobsite_lease('sqlapi-limited', 1, 30)")


@pytest.mark.slow
def test_a_committed_sql_enqueue_is_run_by_a_worker(pg, worker):
    item_id = enqueue(pg, "queue_app.echo", json.dumps({"from": "psql"}), queue="sqlapi-worker")
    pg.commit()
    proc = worker("sqlapi-w1", "--queues", "sqlapi-worker")
    done = wait_for(
        lambda: QueueItem.objects.filter(id=item_id, state="done").first(), 120, what=f"item {item_id} done"
    )
    assert done.result == {"from": "psql"}
    assert proc.poll() is None


@pytest.mark.slow
def test_a_worker_publishes_the_tasks_it_imports_for_sql(pg, worker):
    """tests.tasks.worker_tasks is loaded by the worker's --import only: its start publishes the declarations."""
    pg.execute("DELETE FROM queue_app_sqltask WHERE name = 'tests.flaky'")
    pg.commit()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown task: tests.flaky"):
        enqueue(pg, "tests.flaky")
    pg.rollback()
    worker("sqlapi-w2", "--queues", "sqlapi-none")
    published = wait_for(
        lambda: pg.execute("SELECT max_attempts FROM queue_app_sqltask WHERE name = 'tests.flaky'").fetchone(),
        120,
        what="tests.flaky published by the worker",
    )
    pg.rollback()
    assert published == (3,)
    assert enqueue(pg, "tests.flaky") > 0
