"""The workflow settle triggers run only for a statement that ends a step item (migration 0052): a lease or a
settle of items no workflow owns runs no workflow function, where the statement trigger used to run once per
statement to find nothing to do. PostgreSQL counts each function's calls in the transaction
(pg_stat_xact_user_functions, with track_functions on)."""

import pytest
from django.db import connection

from queue_app import engine
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.add)

pytestmark = pytest.mark.django_db

SETTLE_FUNCTIONS = ("queue_app_wf_item_ended", "queue_app_wf_item_settled", "queue_app_wf_statement_settled")


def _calls() -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE funcname = ANY(%s)", [list(SETTLE_FUNCTIONS)]
        )
        return {name: calls for name, calls in cur.fetchall() if calls}


def _update(item_ids: list[int], state: str) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE queue_app_queueitem SET state = %s WHERE id = ANY(%s)", [state, item_ids])


@pytest.fixture
def counted():
    with connection.cursor() as cur:
        cur.execute("SET LOCAL track_functions = 'pl'")


def test_a_lease_and_a_settle_of_plain_items_run_no_workflow_function(counted):
    ids = [engine.enqueue("t", {"n": n}, queue="plain").id for n in range(3)]

    _update(ids, "reserved")
    _update(ids, "done")

    assert _calls() == {}


def test_a_settle_that_ends_step_items_ends_their_steps_in_one_statement_trigger(counted):
    g = Graph("settle triggers")
    g.task("wf.add", name="a")
    g.task("wf.add", name="b")
    run = services.start_graph(g)
    items = list(run.steps.values_list("item_id", flat=True))
    plain = engine.enqueue("t", queue="plain").id
    assert len(items) == 2

    _update([*items, plain], "reserved")
    assert _calls() == {}
    _update([*items, plain], "done")

    # Each step item noted once, by the row trigger's WHEN; the statement trigger once, for both; the row trigger's
    # own function never (its WHEN answers false).
    assert _calls() == {"queue_app_wf_item_ended": 2, "queue_app_wf_statement_settled": 1}
    assert sorted(run.steps.values_list("state", flat=True)) == ["succeeded", "succeeded"]
