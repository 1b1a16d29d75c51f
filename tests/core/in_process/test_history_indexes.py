"""The admin's indexes cover finished items only (item_history; item_task_not_done, dead and cancelled ones): an
enqueue and a lease write no entry into them, a done settle one (item_history), and the counts and lists that used
full-table indexes before still read indexes only."""

import json

import pytest
from django.db import connection, transaction
from django.db.models import Count

from queue_app import engine
from queue_app.admin.filters import DISTINCT_TASKS, task_names
from queue_app.models import ItemState, QueueItem
from queue_app.monitoring import DEPTH, snapshot

pytestmark = pytest.mark.django_db

HISTORY_INDEXES = ("item_history", "item_task_not_done")


def index_pages(name: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", [name])
        return cur.fetchone()[0]


def test_enqueue_and_lease_write_no_entry_into_the_history_indexes():
    # Rebuilt first (inside the test's transaction, undone with it): pages an earlier test's rows left in them are
    # free space an UPDATE to done would fill without the index growing.
    with connection.cursor() as cur:
        for name in HISTORY_INDEXES:
            cur.execute(f"REINDEX INDEX {name}")
    empty = {name: index_pages(name) for name in HISTORY_INDEXES}

    engine.enqueue_many("t", [{}] * 20_000, queue="q")
    engine.lease(["q"], 5_000, "w1")

    assert {name: index_pages(name) for name in HISTORY_INDEXES} == empty
    # Done: what almost every item ends as, through its lease's settle. Into item_history only.
    reserved = sorted(QueueItem.objects.filter(state=ItemState.RESERVED).values_list("id", flat=True))
    QueueItem.objects.filter(id__in=reserved[1_000:]).update(state=ItemState.DONE)
    assert index_pages("item_history") > empty["item_history"]
    assert index_pages("item_task_not_done") == empty["item_task_not_done"]
    # Dead and cancelled: into both.
    QueueItem.objects.filter(id__in=reserved[:500]).update(state=ItemState.DEAD)
    QueueItem.objects.filter(id__in=reserved[500:1_000]).update(state=ItemState.CANCELLED)
    assert index_pages("item_task_not_done") > empty["item_task_not_done"]


def item_scans(query: str, params: dict) -> list[tuple[str, str | None]]:
    """The item table's scans in the plan of `query`. Sequential scans are priced out: what is proven is that the
    query lets the planner use the partial indexes (their predicates follow from its own conditions); on a table
    this small the planner may rightly prefer reading it whole."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN (FORMAT JSON) " + query, params)
        (plan,) = cur.fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def nodes(node: dict) -> list[dict]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    # A bitmap index scan names its index but not its table
    return [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes(plan[0]["Plan"])
        if n.get("Relation Name") == "queue_app_queueitem" or n.get("Index Name", "").startswith("item_")
    ]


@pytest.fixture
def backlog_and_history() -> None:
    """60,000 items in two queues and two tasks: one in ten open (a drained queue's shape), the rest finished,
    and analyzed: the plans asserted are those of this table, not of the statistics an earlier test left (planned on
    a table last analyzed empty, the depth's hot count walked the task index as readily as item_history). The
    ANALYZE sees this transaction's rows; its column statistics (pg_statistic) go with the test's rollback, the row
    count it writes in place into pg_class stays until the next ANALYZE or VACUUM."""
    for queue, task in (("qa", "billing.charge"), ("qb", "mail.send")):
        engine.enqueue_many(task, [{}] * 30_000, queue=queue)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE queue_app_queueitem SET state = (ARRAY['done', 'dead', 'cancelled'])[1 + id % 3],"
            " finished_at = now() WHERE id % 10 <> 0"
        )
        cur.execute("ANALYZE queue_app_queueitem")


def test_depth_counts_every_state_through_an_index_that_holds_only_that_class_of_state(backlog_and_history):
    scans = item_scans(DEPTH, {"cap": 1_001})

    assert {index for _, index in scans} - {None} == {"item_fetch", "item_in_flight", "item_history"}
    assert "Seq Scan" not in {kind for kind, _ in scans}
    counted = dict(QueueItem.objects.filter(queue_id="qa").values_list("state").annotate(n=Count("id")))
    depth = {q.name: q.depth for q in snapshot(cap=100_000).queues}["qa"]
    assert {state: count.value for state, count in depth.items() if count.value} == counted
    assert len(counted) == 4  # ready, done, dead and cancelled all there


def test_task_names_walk_item_task_not_done_and_add_the_registered_tasks(backlog_and_history):
    scans = item_scans(DISTINCT_TASKS, {"limit": 200})

    assert {index for _, index in scans} - {None} == {"item_task_not_done"}
    assert "Seq Scan" not in {kind for kind, _ in scans}
    names = task_names()
    assert {"billing.charge", "mail.send", "queue_app.noop"} <= set(names)
    assert names == sorted(names)


def test_task_names_offer_a_done_task_once_it_is_archived_and_a_dead_one_at_once():
    """Done items are not in the hot table's task index (each settle would write an entry): an unregistered task
    whose items are done is offered once the archiver moved them (a minute after they finish); one whose items are
    dead or cancelled, at once."""
    engine.enqueue_many("old.done", [{}] * 3, queue="qa")
    engine.enqueue_many("old.dead", [{}], queue="qa")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE queue_app_queueitem SET finished_at = now() - interval '2 minutes',"
            " state = CASE task WHEN 'old.done' THEN 'done' ELSE 'dead' END WHERE task LIKE 'old.%%'"
        )

    names = task_names()
    assert "old.dead" in names and "old.done" not in names
    with transaction.atomic():
        assert engine.archive(grace=60) == 3
    assert {"old.dead", "old.done"} <= set(task_names())
