"""Sub-workflows with real worker processes (issue 48): a child's end ends its parent's step exactly once with two
workers; a parent's cancel goes down to its running child; a start by key under a forced race (the key's claim
held open while the worker's start arrives) yields the one child. The rest is in test_workflow_children.py."""

import pytest
from django.db import transaction

from queue_app.models import QueueItem
from queue_app.workflows import services
from queue_app.workflows.definition import CHILD_START_TASK
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.waiting import seen_waiting, wait_for
from tests.tasks import workflow_child_tasks  # noqa: F401  (registers the wf_parent* workflows)

# Sessions waiting for a lock this one holds: read from pg_locks (live), as pg_stat_activity is read once per
# transaction and this one is held open while it looks.
BLOCKED_BY_ME = "SELECT count(*) FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def workers(spawn):
    def start(n: int = 2) -> list:
        return [
            spawn(
                "run_worker",
                "--queues",
                "default",
                "--concurrency",
                "4",
                "--pool",
                "thread",
                "--import",
                "tests.tasks.workflow_child_tasks",
                "--poll-interval",
                "0.2",
            )  # fmt: skip
            for _ in range(n)
        ]

    return start


def ended(workflow_id: int, timeout: float = 90) -> Workflow:
    def done():
        w = Workflow.objects.get(id=workflow_id)
        return w if w.is_final else None

    return wait_for(done, timeout, what=f"workflow {workflow_id} to end")


def test_each_child_ends_its_parents_step_exactly_once_with_two_workers(workers):
    parents = [services.start("wf_parent", {"x": i}) for i in range(6)]
    workers(2)
    for p in parents:
        assert ended(p.id).state == "succeeded"
    steps = WorkflowStep.objects.filter(workflow_id__in=[p.id for p in parents], name="child")
    assert steps.count() == 6 and {s.state for s in steps} == {"succeeded"}
    # one child each, started once, its step's wait settled once (by the child's end, never by a worker)
    kids = Workflow.objects.filter(name="wf_child")
    assert kids.count() == 6 and {k.state for k in kids} == {"succeeded"}
    assert sorted(s.child_workflow_id for s in steps) == sorted(k.id for k in kids)
    waits = QueueItem.objects.filter(id__in=[s.item_id for s in steps])
    assert {(i.state, i.attempts) for i in waits} == {("done", 0)}
    assert QueueItem.objects.filter(task=CHILD_START_TASK).count() == 6
    totals = dict(
        WorkflowStep.objects.filter(workflow_id__in=[p.id for p in parents], name="total").values_list(
            "workflow_id", "result"
        )
    )
    assert totals == {p.id: int(p.params["x"]) + 1 for p in parents}


def test_cancel_of_the_parent_goes_down_to_its_running_child(workers):
    w = services.start("wf_parent_slow")
    workers(1)
    step = wait_for(
        lambda: WorkflowStep.objects.filter(workflow_id=w.id, name="child", child_workflow_id__isnull=False).first(),
        60,
        what="the child to start",
    )
    wait_for(
        lambda: QueueItem.objects.filter(task="wf.slow", state="reserved").exists(), 60, what="the child's step to run"
    )
    assert services.cancel(w.id, actor="test")
    assert ended(w.id).state == "cancelled"
    child = ended(step.child_workflow_id)
    assert child.state == "cancelled"
    assert WorkflowStep.objects.get(workflow_id=child.id, name="slow").state == "cancelled"


def test_a_start_arriving_while_the_keys_claim_is_held_gets_the_one_child(workers):
    w = services.start("wf_parent_keyed", {"k": "race"})
    with transaction.atomic():
        mine = services.start("wf_child", {"x": 5}, key="shared-race", started_by="test")
        workers(1)
        seen_waiting(BLOCKED_BY_ME, what="the worker's start of the child, on the key's claim held here", timeout=180)
    assert ended(w.id).state == "succeeded"
    assert WorkflowStep.objects.get(workflow_id=w.id, name="child").child_workflow_id == mine.id
    assert Workflow.objects.filter(name="wf_child").count() == 1
    assert ended(mine.id).state == "succeeded"
    assert WorkflowStep.objects.get(workflow_id=w.id, name="total").result == 6
