"""The queue on a database of its own (JOBSITE["DATABASE"], queue_app.routers.JobsiteRouter): two fresh databases,
the application's ("default": auth, sessions, admin) and the queue's ("queue", QUEUE_DATABASE_URL in the
project's settings). `migrate` puts every table of queue_app on the queue's and none on the application's; items
enqueued by the application run once each on real workers; an enqueue inside a transaction of the application's
database is refused (it could not commit with it), and one after that transaction commits goes through; the
admin and the commands read the queue's database."""

import ast
import json
from collections import Counter

import psycopg
import pytest
from django.conf import settings
from django.test import override_settings

from queue_app.engine.alias import check_database, cross_database_guard
from tests.support import fresh_databases
from tests.support.paths import ROOT
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

PROBE = "queue_app.probe"

ENQUEUE = f"""
from django.contrib.auth.models import User
from django.db import transaction
from queue_app import engine
from queue_app.engine.errors import CrossDatabaseEnqueue

try:
    with transaction.atomic():  # the application's database: the item could not commit with the user
        User.objects.create(username="refused")
        engine.enqueue({PROBE!r}, {{"n": -1}})
except CrossDatabaseEnqueue as exc:
    print("refused:", exc)
assert not User.objects.filter(username="refused").exists()
with transaction.atomic():
    User.objects.create(username="after-commit")
    transaction.on_commit(lambda: engine.enqueue({PROBE!r}, {{"n": 0}}))
for n in range(1, 100):
    engine.enqueue({PROBE!r}, {{"n": n}})
engine.enqueue_many({PROBE!r}, [{{"n": n}} for n in range(100, 200)])
with transaction.atomic(using="queue"):  # a transaction on the queue's database: the enqueue joins it
    engine.enqueue({PROBE!r}, {{"n": 200}})
try:
    with transaction.atomic(using="queue"):
        engine.enqueue({PROBE!r}, {{"n": -2}})
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
"""

ADMIN = """
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
client = Client()
client.force_login(User.objects.create_superuser("boss", "boss@example.com", "x"))
for path in ("/admin/", "/admin/queue_app/queueitem/", "/admin/queue_app/worker/", "/metrics"):
    response = client.get(path)
    print(path, response.status_code, len(response.content))
"""


@pytest.fixture(scope="module")
def two_databases(django_db_setup, django_db_blocker):
    """The environment of a child process with the application on one fresh database and the queue on another."""
    with django_db_blocker.unblock():
        from django.db import connection

        base = connection.settings_dict["NAME"]
        names = (f"{base}_app", f"{base}_queue")
        env = {
            "DATABASE_URL": fresh_databases.create(names[0]),
            "QUEUE_DATABASE_URL": fresh_databases.create(names[1]),
            "JOBSITE_ARCHIVE_AFTER": "3600",  # the finished items stay in the hot table to be counted
        }
    yield env
    with django_db_blocker.unblock():
        fresh_databases.drop(*names)


@pytest.mark.slow
def test_the_queue_on_its_own_database_runs_the_applications_items_once_each(two_databases, manage, worker):
    env = two_databases
    for args in (("migrate",), ("migrate", "--database", "queue")):
        done = manage(*args, "--verbosity", "0", env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    app_tables = fresh_databases.tables(env["DATABASE_URL"], "%")
    assert "auth_user" in app_tables and not {t for t in app_tables if t.startswith("queue_app_")}
    queue_tables = fresh_databases.tables(env["QUEUE_DATABASE_URL"])
    assert {"queue_app_queueitem", "queue_app_worker", "queue_app_leader", "queue_app_executionlog"} <= queue_tables
    others = fresh_databases.tables(env["QUEUE_DATABASE_URL"], "%") - queue_tables
    assert others == {"django_migrations"}  # the queue's database holds the queue's tables only
    checked = manage("check", env=env)
    assert checked.returncode == 0, checked.stderr[-3000:]
    with psycopg.connect(env["QUEUE_DATABASE_URL"], autocommit=True) as queue_db:  # as the test database's
        queue_db.execute("DELETE FROM queue_app_schedule")

    procs = {name: worker(name, "--concurrency", "4", env=env) for name in ("own0", "own1")}
    with psycopg.connect(env["QUEUE_DATABASE_URL"], autocommit=True) as queue_db:

        def count(query: str) -> int:
            return queue_db.execute(query).fetchone()[0]

        wait_for(lambda: count("SELECT count(*) FROM queue_app_worker") == 2, timeout=60, what="the two workers up")
        done = manage("shell", "-c", ENQUEUE, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "refused: enqueue on database 'queue' inside a transaction on 'default'" in done.stdout
        wait_for(lambda: count("SELECT count(*) FROM queue_app_executionlog") >= 201, timeout=120, what="201 runs")

        payloads = dict(queue_db.execute("SELECT id, (payload->>'n')::int FROM queue_app_queueitem").fetchall())
        runs = Counter(item for (item,) in queue_db.execute("SELECT item_id FROM queue_app_executionlog"))
        assert sorted(payloads.values()) == list(range(201))  # neither the refused nor the rolled-back one
        assert set(runs) == set(payloads) and set(runs.values()) == {1}  # none lost, none run twice
        assert count("SELECT count(*) FROM queue_app_queueitem WHERE state <> 'done'") == 0

        stats = manage("queue_stats", "--json", env=env)
        assert stats.returncode == 0, stats.stderr[-3000:]
        assert {q["queue"]: q["done"] for q in json.loads(stats.stdout)["queues"]} == {"default": 201}
        pages = manage("shell", "-c", ADMIN, env=env)
        assert pages.returncode == 0, pages.stderr[-3000:]
        codes = dict(line.split()[:2] for line in pages.stdout.splitlines() if line.startswith("/"))
        assert codes == {p: "200" for p in ("/admin/", "/admin/queue_app/queueitem/", "/admin/queue_app/worker/",
                                            "/metrics")}  # fmt: skip

        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            assert proc.wait(30) == 0, proc.log.read_text()[-3000:]
        assert {w for (w,) in queue_db.execute("SELECT DISTINCT worker_id FROM queue_app_executionlog")} <= set(procs)

    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as app_db:
        assert app_db.execute("SELECT username FROM auth_user ORDER BY 1").fetchall() == [("after-commit",), ("boss",)]
    app_tables = fresh_databases.tables(env["DATABASE_URL"], "%")
    assert not {t for t in app_tables if t.startswith("queue_app_")}  # nothing of the queue's, after all that


def test_check_names_a_missing_alias_and_a_missing_router():
    with override_settings(JOBSITE={"DATABASE": "nowhere"}):
        assert [e.id for e in check_database()] == ["jobsite.E142"]
    queue = {**settings.DATABASES["default"]}
    with (
        pytest.warns(UserWarning, match="DATABASES"),  # Django's note on overriding DATABASES: only read here
        override_settings(JOBSITE={"DATABASE": "queue"}, DATABASES={**settings.DATABASES, "queue": queue}),
    ):
        assert [e.id for e in check_database()] == ["jobsite.E143"]
        with override_settings(DATABASE_ROUTERS=["queue_app.routers.JobsiteRouter"]):
            assert check_database() == []
    assert check_database() == []


def test_the_guard_lets_an_enqueue_on_the_only_database_join_any_transaction():
    from django.db import transaction

    with transaction.atomic():
        cross_database_guard()  # one database: nothing to refuse


def _direct_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Django's default connection imported, transaction.atomic/on_commit called, connections["default"]."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "django.db":
            found += [(node.lineno, "from django.db import connection") for a in node.names if a.name == "connection"]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "transaction"
            and node.attr in ("atomic", "on_commit")
        ):
            found.append((node.lineno, f"transaction.{node.attr}"))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "connections"
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == "default"
        ):
            found.append((node.lineno, 'connections["default"]'))
    return found


def test_every_connection_and_transaction_of_jobsites_goes_through_the_queues_alias():
    """No module of queue_app reaches Django's "default" connection or opens a transaction on it by itself: each
    goes through engine/alias.py (connection, atomic, on_commit, queue_db), so JOBSITE["DATABASE"] moves them all."""
    root = ROOT / "queue_app"
    found = [
        f"{path.relative_to(root)}:{line}: {what}"
        for path in sorted(root.rglob("*.py"))
        if "migrations" not in path.parts and path.name != "alias.py"
        for line, what in _direct_uses(ast.parse(path.read_text()))
    ]
    assert found == [], "\n".join(found)
