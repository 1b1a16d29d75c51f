"""The SQL API's functions have one source, queue_app/engine/sql_api.py (built from the engine's own statements),
and migration 0025 holds a frozen copy: the functions a migrated database runs are the module's."""

import pytest
from django.db import connection

from queue_app.engine import sql_api

pytestmark = pytest.mark.django_db

DEFINITIONS = """
SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.proname LIKE 'jobsite\\_%%'
"""


def definitions() -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute(DEFINITIONS)
        return {name: " ".join(text.split()) for name, text in cur.fetchall()}


def test_the_migrated_sql_api_functions_are_the_source_modules():
    migrated = definitions()
    with connection.cursor() as cur:
        cur.execute(sql_api.INSTALL)
    from_source = definitions()
    assert sorted(name.split("(")[0] for name in migrated) == [
        "jobsite_complete",
        "jobsite_enqueue",
        "jobsite_fail",
        "jobsite_lease",
    ]
    assert from_source.keys() == migrated.keys()
    assert {name: text for name, text in from_source.items() if migrated[name] != text} == {}


def test_the_functions_run_the_engines_own_statements():
    """The item INSERT, the dedup claim, the lease and the fenced settles are the engine's statements, bound to
    PL/pgSQL variables, not second copies."""
    for statement in (
        sql_api._ENQUEUE,
        sql_api._ENQUEUE_DEDUP,
        sql_api._DEDUP_OWNER,
        sql_api._LEASE,
        sql_api._COMPLETE,
        sql_api._FAIL,
    ):
        assert statement in sql_api.INSTALL
        assert "%(" not in statement
