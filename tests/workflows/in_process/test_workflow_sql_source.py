"""The workflow engine's SQL has one source, queue_app/workflows/sql.py, and the migrations hold frozen copies of
it: the functions and triggers a migrated database runs are the ones the module says, so the two cannot drift.

Both sides are read back from PostgreSQL (pg_get_functiondef, pg_get_triggerdef), compared with whitespace
normalised: first the migrated test database's, then the same after running the module's INSTALL in the test's
transaction (rolled back after it).
"""

import re

import pytest
from django.db import connection

from queue_app.workflows import sql as workflow_sql

pytestmark = pytest.mark.django_db

# The workflow functions: queue_app_wf_*, and the cascade of a deleted workflow.
WORKFLOW_FUNCTION = r"^queue_app_(wf_|workflow_)"
DEFINITIONS = """
SELECT 'function ' || p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.proname ~ %(pattern)s
UNION ALL
SELECT 'trigger ' || t.tgname || ' on ' || t.tgrelid::regclass::text, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
WHERE NOT t.tgisinternal AND p.proname ~ %(pattern)s
"""


def definitions() -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute(DEFINITIONS, {"pattern": WORKFLOW_FUNCTION})
        return {name: " ".join(text.split()) for name, text in cur.fetchall()}


def test_the_migrated_workflow_functions_and_triggers_are_the_source_modules():
    migrated = definitions()
    with connection.cursor() as cur:
        cur.execute(workflow_sql.INSTALL)
    from_source = definitions()
    # 0032 added queue_app_wf_decide, 0033 queue_app_wf_step_deadline and its trigger workflow_step_deadline,
    # 0043 the sub-workflows' four functions and three triggers
    assert sum(name.startswith("function ") for name in migrated) == 15
    assert sum(name.startswith("trigger ") for name in migrated) == 8
    # A function or trigger the module defines anew (or with another signature) would be an extra entry...
    assert from_source.keys() == migrated.keys()
    # ... one the migrations changed, or the module, a different text.
    assert {name: text for name, text in from_source.items() if migrated[name] != text} == {}


def test_the_source_module_defines_every_workflow_function_and_trigger_of_the_database():
    """What the module's INSTALL names is the whole set: a function or trigger the migrations installed and the
    module forgot would survive its INSTALL unchanged and look the same on both sides."""
    named = {m.group(1) for m in re.finditer(r"CREATE OR REPLACE FUNCTION (\w+)\(", workflow_sql.INSTALL)}
    named |= {m.group(1) for m in re.finditer(r"CREATE OR REPLACE TRIGGER (\w+) ", workflow_sql.INSTALL)}
    in_database = {re.match(r"(function|trigger) (\w+)", name).group(2) for name in definitions()}
    assert named == in_database


def test_every_item_a_workflow_makes_is_written_by_the_one_fragment_with_no_literal_attempts():
    """The step-spec-to-item SQL is written once (_items_from_specs): a step's item, a callback's, an approval's
    webhook event, a step's deadline and a fan-out's are each that fragment, and no attempts are written as a
    number (they fall back to the workflow's copy of the DEFAULT_MAX_ATTEMPTS setting). So are a sub-workflow
    step's start and its child's cancel."""
    fragment = workflow_sql._items_from_specs(
        "r", spec="s", payload="p", item_id="i", step_id="t", attempts="a", trace="c"
    )
    assert "COALESCE((s->>'max_attempts')::int, q.max_attempts, a)" in fragment
    insert = f"INSERT INTO {workflow_sql.ITEM} "
    assert (workflow_sql.INSTALL.count(insert), workflow_sql.WORKFLOW_FAN_OUT.count(insert)) == (6, 1)
    for text in (workflow_sql.ENQUEUE_FUNCTION, workflow_sql.CALLBACK_FUNCTION, workflow_sql.WORKFLOW_FAN_OUT):
        assert re.search(r"q\.max_attempts, \w+\.default_max_attempts\)", text)
    assert not re.search(r"max_attempts, \d", workflow_sql.INSTALL + workflow_sql.WORKFLOW_FAN_OUT)


def test_a_workflow_keeps_the_default_attempts_setting_it_started_under(settings):
    from queue_app.workflows import services
    from queue_app.workflows.definition import Graph
    from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.add)

    settings.JOBSITE = {"DEFAULT_MAX_ATTEMPTS": 3}
    g = Graph("attempts")
    g.task("wf.add", name="a")
    assert services.start_graph(g).default_max_attempts == 3
