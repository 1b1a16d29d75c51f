"""The cheaper reset after a transactional test (tests/support/db_reset.py) leaves the database as Django's flush would:
rows written by the test or by a child process are gone, the seeded rows (content types, permissions, datasets,
the SQL API's declarations) are as the flush's post_migrate leaves them, and a change to a seeded table falls
back to the flush itself."""

import threading

import pytest
from django.db import connection, connections
from django.db.models.signals import post_migrate

from tests.support import db_reset
from tests.support.waiting import seen_waiting

pytestmark = pytest.mark.django_db(transaction=True)

# What the flush's post_migrate restores, by natural key (ids and timestamps differ from one flush to the next).
SEEDED_CONTENT = {
    "content types": "SELECT app_label, model FROM django_content_type",
    "permissions": "SELECT ct.app_label, ct.model, p.codename, p.name FROM auth_permission p"
    " JOIN django_content_type ct ON ct.id = p.content_type_id",
    "datasets": "SELECT name, config::text, declared_in FROM queue_app_dataset",
    "SQL API tasks": "SELECT name, queue, max_attempts, dedup_window, at_most_once FROM queue_app_sqltask",
    "SQL API settings": "SELECT default_queue, dedup_window, notify_channel, default_lease_timeout,"
    " default_max_attempts, default_retention_days, max_payload_bytes, max_payload_depth FROM queue_app_sqlsettings",
}


def model_tables() -> list[str]:
    return sorted(connection.introspection.django_table_names(only_existing=True, include_views=False))


def state() -> dict[str, object]:
    """Every model table's row count and the seeded tables' contents."""
    found: dict[str, object] = {}
    with connection.cursor() as cursor:
        for table in model_tables():
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            found[table] = cursor.fetchone()[0]
        for name, query in SEEDED_CONTENT.items():
            cursor.execute(query)
            found[name] = sorted(cursor.fetchall(), key=repr)
    return found


def flushed_state() -> dict[str, object]:
    """The state Django's flush leaves (what TransactionTestCase ran before this reset): db_reset's full path
    runs it as TransactionTestCase did, and takes the seeded tables' fingerprints again."""
    db_reset._full_flush("default")
    return state()


# The model tables the flush leaves rows in (its post_migrate writes them).
SEEDED_TABLES = {"django_content_type", "auth_permission", "queue_app_dataset"}


def unseeded_tables_with_rows() -> list[str]:
    return [t for t, n in state().items() if t in model_tables() and t not in SEEDED_TABLES and n]


def write_rows(manage) -> None:
    """Rows in several tables: a user and a queued item from this process, queued items from a child process."""
    from django.contrib.auth.models import User

    from queue_app import engine

    User.objects.create_user("reset-probe", password="x")
    engine.enqueue("queue_app.noop", {})
    child = manage("enqueue", "queue_app.noop", "--count", "3")
    assert child.returncode == 0, child.stderr


def test_rows_of_the_test_and_of_a_child_process_are_gone_after_the_cheap_reset(manage):
    db_reset.reset("default")  # the fingerprints to compare with (a full flush if this is the session's first)
    assert set(db_reset._baseline["default"]) == SEEDED_TABLES  # found by looking: the tables it fingerprints
    write_rows(manage)
    assert {"auth_user", "queue_app_queueitem"} <= set(unseeded_tables_with_rows())
    fast_before = db_reset.stats["fast"]

    db_reset.reset("default")

    assert db_reset.stats["fast"] == fast_before + 1  # the cheap path, not the flush
    assert unseeded_tables_with_rows() == []
    after_reset = state()
    assert after_reset == flushed_state()


def test_a_table_emptied_again_is_truncated_and_an_unwritten_one_is_left_alone():
    """Rows inserted then deleted leave dead rows (pages, until a vacuum) that the flush's TRUNCATE removed: the
    reset truncates that table too. A table nobody wrote keeps its file: the reset is selective."""
    db_reset.reset("default")
    sizes = "SELECT pg_relation_size('django_session'), pg_relation_filenode('auth_group')"
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO django_session VALUES ('reset-probe', '', now())")
        cursor.execute("DELETE FROM django_session")
        cursor.execute(sizes)
        written, unwritten = cursor.fetchone()
    assert written > 0

    db_reset.reset("default")

    with connection.cursor() as cursor:
        cursor.execute(sizes)
        assert cursor.fetchone() == (0, unwritten)


def test_a_changed_seeded_table_gets_the_full_flush():
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    db_reset.reset("default")
    expected = state()
    Permission.objects.create(
        codename="reset_probe", name="probe", content_type=ContentType.objects.get_for_model(Permission)
    )
    full_before = db_reset.stats["full"]

    db_reset.reset("default")

    assert db_reset.stats["full"] == full_before + 1
    assert not Permission.objects.filter(codename="reset_probe").exists()
    assert state() == expected


def test_a_changed_datasets_table_is_synced_again_without_the_flush():
    """A row of a dataset no module declares (as record_materialization or another process's sync writes) and a
    changed declaration: the reset empties the table and syncs it, leaving what the flush's sync would."""
    db_reset.reset("default")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_app_dataset (name, config, declared_in, synced_at)"
            " SELECT 'reset-probe', config, declared_in, now() FROM queue_app_dataset LIMIT 1"
        )
        cursor.execute(
            "UPDATE queue_app_dataset SET config = '{}' WHERE name = (SELECT min(name) FROM queue_app_dataset)"
        )
    fast_before = db_reset.stats["fast"]

    db_reset.reset("default")

    assert db_reset.stats["fast"] == fast_before + 1
    assert state() == flushed_state()


def test_a_dataset_declared_or_taken_away_since_the_last_sync_is_synced_as_the_flush_would(tmp_path, monkeypatch):
    """The flush's sync writes this process's declarations from scratch: one declared since (no row yet) gets its
    row, one taken away since (its row unchanged) loses it, though the table itself did not change."""
    from queue_app.datasets import dataset
    from queue_app.datasets.declarations import _code
    from queue_app.datasets.locations import ROOTS_ENV

    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    db_reset.reset("default")
    fast_before = db_reset.stats["fast"]
    dataset("reset_probe_ds", location="probe", owner="ops")
    try:
        db_reset.reset("default")
        assert ("reset_probe_ds",) in [row[:1] for row in state()["datasets"]]
        assert state() == flushed_state()
    finally:
        _code.unregister("reset_probe_ds")

    db_reset.reset("default")

    assert db_reset.stats["fast"] == fast_before + 2
    assert ("reset_probe_ds",) not in [row[:1] for row in state()["datasets"]]
    assert state() == flushed_state()


def test_a_write_in_flight_is_waited_for_and_emptied():
    """Another session (the backend of a child process killed mid-write, say) has inserted but not committed:
    the reset waits for it (its SHARE locks), then sees the row and empties the table. Without the locks the
    survey would miss the row and it would outlive the reset."""
    db_reset.reset("default")
    writer = connections.create_connection("default")
    writer.set_autocommit(False)
    with writer.cursor() as cursor:
        cursor.execute("INSERT INTO django_session VALUES ('reset-probe', '', now() + interval '1 day')")
    resetting = threading.Thread(target=lambda: (db_reset.reset("default"), connections.close_all()))
    resetting.start()
    try:
        seen_waiting(what="the reset waiting for the uncommitted insert")
        writer.commit()
        resetting.join(60)
    finally:
        writer.close()
    assert not resetting.is_alive()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_session")
        assert cursor.fetchone()[0] == 0


def test_a_child_process_writes_rows(manage):
    """With the next test: the teardown between them (the installed reset) removes what this one left."""
    write_rows(manage)
    assert len(unseeded_tables_with_rows()) >= 2


def test_the_next_test_finds_the_tables_empty():
    """Run after the one above (file order): every table but the seeded ones is empty."""
    from django.contrib.auth.models import User

    from queue_app import engine

    assert unseeded_tables_with_rows() == []
    assert not User.objects.exists()
    engine.enqueue("queue_app.noop", {})  # the queue works on the truncated tables
    assert "queue_app_queueitem" in unseeded_tables_with_rows()


def test_the_reset_knows_every_post_migrate_receiver():
    """db_reset re-runs the project's receivers and trusts the fingerprints for contrib's: a new receiver goes
    into db_reset's re-run (or is shown to write only fingerprinted tables) before it goes into this list."""
    receivers = {ref().__qualname__ for _, ref, _, _ in post_migrate.receivers if ref() is not None}
    assert receivers == {
        "rename_permissions_after_model_rename",  # writes only on a model rename (a migration)
        "create_permissions",  # auth_permission: fingerprinted
        "create_contenttypes",  # django_content_type: fingerprinted
        "sync_after_migrate",  # re-run by db_reset
        "publish_declarations",  # re-run by db_reset
    }
