"""The reset after a transactional test: TRUNCATE only the tables it wrote, instead of Django's `flush`.

pytest-django runs a transactional test (``django_db(transaction=True)``, ``transactional_db``, ``live_server``)
as a Django ``TransactionTestCase``, whose teardown (``_fixture_teardown``) runs ``flush``: one TRUNCATE of every
model table, then the ``post_migrate`` signal again (content types, a permission for every model, the datasets'
sync, the SQL API's published declarations). That cost about 0.25 s per test on an empty database (the TRUNCATE of
47 tables about 0.22 s of it: every table, index and TOAST table gets a new file), whatever the test wrote.

This reset leaves the database in the state the flush would, for less:

1. In one transaction, SHARE locks on every model table (a writer still in flight, such as the backend of a
   child process killed mid-statement, finishes first, and no new one starts until the commit: as with the
   flush's TRUNCATE of every table), then one statement asks every model table whether it was written since
   its last TRUNCATE (its heap has a page: ``pg_relation_size``, summed over partitions; rows, or dead rows
   of a table the test emptied again) and takes a fingerprint (md5 of its rows) of each *seeded* table: a
   table that holds rows right after a full flush (``django_content_type``, ``auth_permission``,
   ``queue_app_dataset``), found by looking, not by name.
2. A changed content type or permission table (a test added a permission) means the cheap way cannot restore
   it: Django's own flush runs, as before, and the fingerprints are taken again. The first transactional test
   of a session gets the flush too (nothing to compare with yet). A changed ``queue_app_dataset`` (a test or a
   worker recorded or synced datasets of its own), or a change to the datasets this process declares (a test
   declared one or took one away: the flush's sync writes them from scratch), is emptied like the written tables
   and synced again in 4.
3. One TRUNCATE empties the written tables (and the changed datasets table), with the tables that reference
   them (PostgreSQL requires them named: they are unwritten, or written and in the list already).
   Whether the test, a thread, the live server or a child process wrote the rows does not matter: the question
   is asked of the committed data.
4. The project's own ``post_migrate`` receivers run again (``sync_after_migrate``, ``publish_declarations``;
   both idempotent, a few ms): the SQL API's tables (``queue_app_sqltask``/``sqlsettings``) are not model
   tables, the flush never truncated them, only re-published this process's declarations and settings, and so
   does this. tests/project/in_process/test_db_reset.py fails if a ``post_migrate`` receiver appears that this module
   does not know.

Like the flush it replaces (``reset_sequences=False``), it restarts no sequence: no test may rely on ids.
A test class that sets ``available_apps`` or ``serialized_rollback`` (tests/django_suite) keeps Django's flush,
and so does every test under ``JOBSITE_TEST_FULL_FLUSH=1``.
"""

from __future__ import annotations

import os

from django.core.management import call_command
from django.db import connections, transaction
from django.test import TransactionTestCase

_original_teardown = TransactionTestCase._fixture_teardown
# Per database alias: the fingerprint of each seeded table taken right after the last full flush.
_baseline: dict[str, dict[str, str]] = {}
# Per database alias: the datasets this process declared when the datasets table was last synced from scratch.
_declared: dict[str, str] = {}
# The seeded tables the project's post_migrate receivers fill again by themselves (sync_after_migrate): a change
# to one is undone by emptying it and re-running them, without the flush.
RESEEDED = {"queue_app_dataset"}
stats = {"fast": 0, "full": 0}  # how each reset went (tests/project/in_process/test_db_reset.py reads them)


def _quote(connection, table: str) -> str:
    return connection.ops.quote_name(table)


def _model_tables(connection) -> list[str]:
    return sorted(connection.introspection.django_table_names(only_existing=True, include_views=False))


def _survey(connection, tables: list[str], seeded: set[str]) -> tuple[set[str], dict[str, str]]:
    """(the unseeded tables that were written, each seeded table's fingerprint) in one statement. Written: its
    heap has a page (summed over its partitions). TRUNCATE leaves a table none, any insert gives it one, and a
    table the test emptied again keeps its pages (dead rows, until a vacuum): the flush gave such a table a
    fresh file too, so it is truncated as well. Cheaper than EXISTS, which reads a bloated table's dead rows."""
    parts, params = [], []
    for table in tables:
        quoted = _quote(connection, table)
        if table in seeded:
            value = f"(SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {quoted} t)"
            params.append(table)
        else:
            value = (  # pg_partition_tree: no row for a table that is not partitioned
                "(SELECT CASE WHEN pg_relation_size(%s::regclass)"
                " + coalesce((SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree(%s::regclass)), 0) > 0"
                " THEN 'written' END)"
            )
            params.extend([table, quoted, quoted])
        parts.append(f"SELECT %s, {value}")
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        rows = cursor.fetchall()
    holding = {table for table, value in rows if table not in seeded and value is not None}
    return holding, {table: value for table, value in rows if table in seeded}


def _referencing_tables(connection) -> dict[str, set[str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT parent.relname, child.relname FROM pg_constraint k"
            " JOIN pg_class child ON child.oid = k.conrelid JOIN pg_class parent ON parent.oid = k.confrelid"
            " WHERE k.contype = 'f' AND child.relnamespace = current_schema()::regnamespace"
        )
        found: dict[str, set[str]] = {}
        for parent, child in cursor.fetchall():
            found.setdefault(parent, set()).add(child)
    return found


def _closure(tables: set[str], referencing: dict[str, set[str]]) -> set[str]:
    """`tables` and every table that references one of them, transitively (what TRUNCATE needs named)."""
    todo, seen = list(tables), set(tables)
    while todo:
        for child in referencing.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _full_flush(db_name: str) -> None:
    """Django's flush, as TransactionTestCase runs it (no available_apps), then the seeded tables' fingerprints."""
    call_command(
        "flush",
        verbosity=0,
        interactive=False,
        database=db_name,
        reset_sequences=False,
        allow_cascade=False,
        inhibit_post_migrate=False,
    )
    connection = connections[db_name]
    tables = _model_tables(connection)
    holding, _ = _survey(connection, tables, set())
    _, _baseline[db_name] = _survey(connection, tables, holding)
    _declared[db_name] = _declarations()
    stats["full"] += 1


def _declarations() -> str:
    """What the datasets' sync would write from this process: a test may declare a dataset, or take one away."""
    from queue_app.datasets.declarations import declared_datasets

    return repr(sorted((name, d.declared_in, repr(d.config())) for name, d in declared_datasets().items()))


def _rerun_project_receivers(db_name: str) -> None:
    from queue_app import registry
    from queue_app.datasets.sync import sync_after_migrate

    sync_after_migrate(using=db_name)
    registry.publish_declarations(using=db_name)


def _cheap_reset(connection, baseline: dict[str, str]) -> set[str] | None:
    """Truncate what was written; the seeded tables it emptied (to be re-seeded), or None if only the flush will
    do. SHARE locks on every model table first: a writer still in flight (the backend of a child process killed
    mid-statement) finishes before the survey looks, and none starts until the TRUNCATE is committed, as with the
    flush's TRUNCATE of every table."""
    tables = _model_tables(connection)
    if not set(baseline) <= set(tables):  # a test migrated a seeded table away: the flush decides what to do
        return None
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("LOCK TABLE " + ", ".join(_quote(connection, t) for t in tables) + " IN SHARE MODE")
        holding, fingerprints = _survey(connection, tables, set(baseline))
        changed = {t for t in baseline if fingerprints.get(t) != baseline[t]}
        if "queue_app_dataset" in baseline and _declarations() != _declared.get(connection.alias):
            changed.add("queue_app_dataset")  # the flush's sync would write other rows: sync from scratch
        if changed - RESEEDED:  # content types or permissions: only the flush's post_migrate restores them
            return None
        truncate = _closure(holding | changed, _referencing_tables(connection))  # each time: a test may migrate
        if truncate & (set(baseline) - changed):  # a seeded table references a written table
            return None
        if truncate:
            cursor.execute("TRUNCATE " + ", ".join(_quote(connection, t) for t in sorted(truncate)))
    return changed


def reset(db_name: str) -> None:
    """Leave `db_name` as Django's flush would, truncating only what was written (module docstring)."""
    connection = connections[db_name]
    baseline = _baseline.get(db_name)
    reseed = None if baseline is None else _cheap_reset(connection, baseline)
    if reseed is None:
        return _full_flush(db_name)
    _rerun_project_receivers(db_name)
    if reseed:  # re-synced: new timestamps, so new fingerprints
        _, fingerprints = _survey(connection, sorted(reseed), reseed)
        baseline.update(fingerprints)
        _declared[db_name] = _declarations()
    stats["fast"] += 1


def _fixture_teardown(self) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        return _original_teardown(self)
    for db_name in self._databases_names(include_mirrors=False):
        reset(db_name)


def install() -> None:
    """Put this reset in place of TransactionTestCase's flush (tests/conftest.py, at configure), unless
    JOBSITE_TEST_FULL_FLUSH=1 asks for Django's flush after every transactional test (to compare times, or to
    rule the reset out when a test's isolation is in doubt)."""
    if os.environ.get("JOBSITE_TEST_FULL_FLUSH", "") not in ("", "0"):
        return
    TransactionTestCase._fixture_teardown = _fixture_teardown
