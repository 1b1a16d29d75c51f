"""jobsite as a role that is not superuser: `jobsite_app_*` (NOSUPERUSER NOCREATEROLE NOCREATEDB) owns a fresh
database and has the operator's limits set on it (statement_timeout and idle_in_transaction_session_timeout 5 s).
As that role: `migrate`, a real worker draining items, the history's day partitions archived into, created
ahead and dropped, the SQL API (enqueue, lease, complete), the admin's pages and a command. One set-up for the
module: the role, its database, migrated once."""

from collections import Counter

import psycopg
import pytest

from tests.support import fresh_databases
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

PROBE = "queue_app.probe"
PASSWORD = "jobsite-app-secret"

ROTATE = """
import datetime as dt
from queue_app import engine
from queue_app.engine import history

moved = engine.within_lock_timeout(lambda: engine.archive(grace=0), "archive")
ahead = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=40)
created = engine.within_lock_timeout(lambda: engine.ensure_partitions(2, today=ahead), "partition creation")
later = dt.datetime.combine(ahead, dt.time(), dt.UTC) + dt.timedelta(days=60)
dropped = engine.within_lock_timeout(lambda: len(engine.drop_expired_partitions(now=later)), "partition drop")
print("moved", moved, "created", created, "dropped", dropped, "left", len(history.partitions()))
"""

ADMIN = """
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
client = Client()
client.force_login(User.objects.create_superuser("boss", "boss@example.com", "x"))
for path in ("/admin/", "/admin/queue_app/queueitem/", "/admin/queue_app/itemhistory/", "/admin/queue_app/worker/",
             "/metrics", "/healthz"):
    response = client.get(path)
    print(path, response.status_code)
"""


@pytest.fixture(scope="module")
def plain_role(django_db_setup, django_db_blocker):
    """(the role's name, the environment of a child process connecting as it to its own migrated database)."""
    with django_db_blocker.unblock():
        from django.db import connection

        base = connection.settings_dict["NAME"]
        role, name = f"jobsite_app_{base}"[:63], f"{base}_role"
        with fresh_databases.admin() as su:
            su.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            su.execute(f'DROP ROLE IF EXISTS "{role}"')
            su.execute(
                f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{PASSWORD}' NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION"
                " NOBYPASSRLS"
            )
            su.execute(f"ALTER ROLE \"{role}\" SET statement_timeout = '5s'")
            su.execute(f"ALTER ROLE \"{role}\" SET idle_in_transaction_session_timeout = '5s'")
        fresh_databases.create(name, owner=role)
        env = {
            "DATABASE_URL": fresh_databases.url(name, user=role, password=PASSWORD),
            "JOBSITE_ARCHIVE_AFTER": "3600",  # the test archives itself, when it chooses
        }
    yield role, env
    with django_db_blocker.unblock():
        fresh_databases.drop(name)
        with fresh_databases.admin() as su:
            su.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.mark.slow
def test_a_role_that_is_not_superuser_migrates_runs_archives_and_serves(plain_role, manage, worker):
    role, env = plain_role
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as pg:
        assert pg.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, current_setting('statement_timeout'),"
            " current_setting('idle_in_transaction_session_timeout') FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (False, False, False, "5s", "5s")

    done = manage("migrate", "--verbosity", "0", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    checked = manage("check", env=env)
    assert checked.returncode == 0, checked.stderr[-3000:]

    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as pg:  # as the test database: no shipped schedule
        pg.execute("DELETE FROM queue_app_schedule")
    proc = worker("plain0", "--concurrency", "4", "--queues", "default", env=env)  # "by-sql" is the SQL API's
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as pg:

        def count(query: str) -> int:
            return pg.execute(query).fetchone()[0]

        wait_for(lambda: count("SELECT count(*) FROM queue_app_worker") == 1, timeout=60, what="the worker up")
        done = manage(
            "shell", "-c", f"from queue_app import engine\nengine.enqueue_many({PROBE!r}, [{{}}] * 100)", env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # The SQL API, as the role: an item in, and one of another queue leased and completed by SQL alone.
        sql_item = pg.execute("SELECT jobsite_enqueue(%s, '{}'::jsonb)", [PROBE]).fetchone()[0]
        pg.execute("SELECT jobsite_enqueue('queue_app.echo', '{}'::jsonb, queue => 'by-sql')")
        [(reservation,)] = pg.execute("SELECT reservation_id FROM jobsite_lease('by-sql', 1, 30)").fetchall()
        assert pg.execute("SELECT jobsite_complete(%s, '{\"ok\": 1}'::jsonb)", [reservation]).fetchone()[0] is True

        wait_for(lambda: count("SELECT count(*) FROM queue_app_executionlog") >= 101, timeout=120, what="101 runs")
        runs = Counter(item for (item,) in pg.execute("SELECT item_id FROM queue_app_executionlog"))
        assert len(runs) == 101 and set(runs.values()) == {1} and sql_item in runs
        # The handler writes its log line as it runs; the worker settles the item done after, with a later round
        # trip (a CI run with three test workers once looked between the two)
        wait_for(
            lambda: count("SELECT count(*) FROM queue_app_queueitem WHERE state <> 'done'") == 0,
            timeout=60,
            what="every item settled done",
        )

        rotated = manage("shell", "-c", ROTATE, env=env)
        assert rotated.returncode == 0, rotated.stderr[-3000:]
        words = next(line for line in rotated.stdout.splitlines() if line.startswith("moved ")).split()
        figures = dict(zip(words[0::2], (int(w) for w in words[1::2]), strict=True))
        assert figures["moved"] == 102 and figures["created"] == 3 and figures["dropped"] >= 3, rotated.stdout
        assert count("SELECT count(*) FROM queue_app_queueitem") == 0

        pages = manage("shell", "-c", ADMIN, env=env)
        assert pages.returncode == 0, pages.stderr[-3000:]
        codes = dict(line.split()[:2] for line in pages.stdout.splitlines() if line.startswith("/"))
        assert set(codes.values()) == {"200"} and len(codes) == 6, pages.stdout
        stats = manage("queue_stats", env=env)
        assert stats.returncode == 0, stats.stderr[-3000:]

        proc.terminate()
        assert proc.wait(30) == 0, proc.log.read_text()[-3000:]
        log = proc.log.read_text()
        assert "permission denied" not in log and "must be superuser" not in log and "Traceback" not in log, log[-3000:]
        # Everything of jobsite's in the database is the role's own: nothing was made as another.
        assert (
            pg.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND pg_get_userbyid(c.relowner) <> current_user"
            ).fetchone()[0]
            == 0
        )
