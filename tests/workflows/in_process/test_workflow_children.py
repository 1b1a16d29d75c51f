"""Sub-workflows (issue 48): `wf.workflow(name, params, key=...)` starts a child workflow and ends with it, in the
transactions that record each fact (workflows/children.py, workflows/sql.py). In process: the test is the worker,
leasing what is due and running the registered handlers (the triggers move the steps); the proofs with real
worker processes are in test_workflow_children_workers.py."""

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from queue_app import engine
from queue_app.models import ProbeEffect, QueueItem
from queue_app.registry import get_task
from queue_app.workflows import WorkflowDefinitionError, child_steps, children, services
from queue_app.workflows.definition import CHILD_CANCEL_TASK, CHILD_START_TASK, Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.tracing_fixtures import receiver_fixture, traced_fixture  # noqa: F401  fixtures
from tests.tasks import workflow_child_tasks  # noqa: F401  (registers the wf_parent* workflows)

pytestmark = pytest.mark.django_db


def drive(skip: tuple[str, ...] = ()) -> list[str]:
    """Lease and run every due item until none is left (but those of `skip`, left ready), as a worker would:
    its handler and settle in one transaction; an exception kills it. Returns the tasks run, in order."""
    # (a skipped item stays leased for the test's length, so each round leases only new work)
    ran = []
    while leases := engine.lease(None, 100, "test", lease_timeout=600):
        progressed = False
        for held in leases:
            if held.task in skip:
                continue  # held (reserved) and never settled: not leased again
            progressed = True
            ran.append(held.task)
            try:
                with transaction.atomic():
                    engine.complete(held, get_task(held.task).func(held.payload, held))
            except Exception as exc:  # noqa: BLE001  (the handler's failure is the outcome)
                engine.dead(held, f"{type(exc).__name__}: {exc}")
        if not progressed:
            break
    return ran


def step(w: Workflow, name: str) -> WorkflowStep:
    w.refresh_from_db()
    return WorkflowStep.objects.get(workflow_id=w.id, attempt=w.attempt, name=name)


def child_of(w: Workflow, name: str = "child") -> Workflow:
    return Workflow.objects.get(id=step(w, name).child_workflow_id)


def test_the_child_runs_and_its_result_is_passed_on_to_the_parents_next_step():
    w = services.start("wf_parent", {"x": 7})
    ran = drive()
    w.refresh_from_db()
    assert w.state == "succeeded"
    child = child_of(w)
    assert (child.name, child.state, child.params) == ("wf_child", "succeeded", {"x": 7})
    s = step(w, "child")
    assert s.state == "succeeded"
    assert s.result == {"workflow_id": child.id, "state": "succeeded", "results": {"b": 8}}
    assert step(w, "total").result == 8
    assert ran.count(CHILD_START_TASK) == 1
    # the step's wait settled once, done, by the child's end (no worker ran it)
    wait = QueueItem.objects.get(id=s.item_id)
    assert (wait.state, wait.attempts) == ("done", 0)
    status = services.status(w.id)
    assert status["children"] == [{"step": "child", "workflow_id": child.id, "name": "wf_child", "state": "succeeded"}]
    assert status["parent"] is None
    assert [st["child_workflow_id"] for st in status["steps"] if st["kind"] == "workflow"] == [child.id]
    assert services.status(child.id)["parent"] == {
        "workflow_id": w.id,
        "name": "wf_parent",
        "step": "child",
        "attempt": 1,
    }
    assert children.root_of(child.id) == (w.id, "wf_parent")


def test_the_step_waits_for_the_child_and_says_so():
    w = services.start("wf_parent")
    assert services.status(w.id)["steps"][1]["state"] == "waiting"
    # run the first step and the start only: the child's steps stay ready
    for held in engine.lease(None, 100, "test", lease_timeout=600):
        if held.task == "wf.add":
            engine.complete(held, 0)
    for held in engine.lease(None, 100, "test", lease_timeout=600):
        assert held.task == CHILD_START_TASK
        with transaction.atomic():
            engine.complete(held, get_task(held.task).func(held.payload, held))
    by_name = {s["name"]: s for s in services.status(w.id)["steps"]}
    assert by_name["child"]["state"] == "waiting_child"
    assert Workflow.objects.get(id=by_name["child"]["child_workflow_id"]).state == "running"


def test_a_grandchild_is_one_more_level_and_the_root_is_the_top():
    w = services.start("wf_grandparent")
    drive()
    w.refresh_from_db()
    assert w.state == "succeeded"
    parent = child_of(w, "parent")
    grandchild = child_of(parent)
    assert step(w, "parent").result["results"] == {"total": 3}
    assert children.root_of(grandchild.id) == (w.id, "wf_grandparent")


def test_a_failed_child_fails_the_step_and_the_parent_compensates():
    w = services.start("wf_parent_fails")
    drive()
    w.refresh_from_db()
    child = child_of(w)
    assert child.state == "failed"
    assert w.state == "failed"
    s = step(w, "child")
    assert s.state == "failed"
    assert s.error.startswith(f"child workflow {child.id} failed")
    assert step(w, "total").state == "cancelled"
    assert step(w, "undo first").state == "succeeded"  # the saga of the parent's completed steps


def test_repair_of_the_parent_repairs_the_failed_child():
    w = services.start("wf_parent_fails")
    drive()
    child = child_of(w)
    ProbeEffect.objects.create(key="fixed", applied=1)
    services.repair(w.id)
    drive()
    w.refresh_from_db()
    child.refresh_from_db()
    assert w.state == "succeeded" and w.attempt == 2
    assert step(w, "child").child_workflow_id == child.id  # the same child, repaired: a new attempt of it
    assert (child.state, child.attempt) == ("succeeded", 2)
    assert step(w, "child").result["results"] == {"b": "fixed"}
    assert WorkflowStep.objects.get(workflow_id=child.id, attempt=2, name="a").kept  # its succeeded step kept


def test_cancel_of_the_parent_goes_down_to_the_child():
    w = services.start("wf_parent_slow")
    drive(skip=("wf.slow",))
    child = child_of(w)
    assert child.state == "running"
    assert services.cancel(w.id, actor="me")
    w.refresh_from_db()
    assert w.state == "cancelled"
    assert step(w, "child").state == "cancelled"
    ran = drive(skip=("wf.slow",))
    assert ran.count(CHILD_CANCEL_TASK) == 1
    child.refresh_from_db()
    assert child.state in ("cancelling", "cancelled")
    assert child.error == f"cancelled by workflow {w.id} (step 'child' cancelled)"


def test_a_step_cancelled_before_its_start_ran_starts_no_child():
    w = services.start("wf_parent")
    for held in engine.lease(None, 100, "test", lease_timeout=600):  # "first": the child's step becomes ready
        engine.complete(held, 0)
    assert QueueItem.objects.filter(task=CHILD_START_TASK, state="ready").count() == 1
    assert services.cancel(w.id)
    drive()
    assert not Workflow.objects.filter(name="wf_child").exists()


def test_a_first_step_starts_its_child_in_the_parents_start_transaction_and_cancel_goes_down():
    """A sub-workflow step with nothing to wait for: its child is made and linked when the parent starts (no
    start item), in the caller's transaction (rolled back with it); the parent's cancel goes down to it."""
    with transaction.atomic():
        services.start("wf_parent_slow")
        transaction.set_rollback(True)
    assert not Workflow.objects.exists()
    w = services.start("wf_parent_slow")
    child = child_of(w)
    assert (child.state, child.started_by) == ("running", f"workflow {w.id}")
    assert services.status(w.id)["steps"][0]["state"] == "waiting_child"
    assert not QueueItem.objects.filter(task=CHILD_START_TASK).exists()
    assert services.cancel(w.id, actor="me")
    assert drive(skip=("wf.slow",)).count(CHILD_CANCEL_TASK) == 1
    child.refresh_from_db()
    assert child.state in ("cancelling", "cancelled")


def test_starting_twice_yields_the_same_child_and_a_shared_key_ends_both_parents():
    one = services.start("wf_parent_keyed", {"k": "a"})
    two = services.start("wf_parent_keyed", {"k": "a"})
    drive()
    one.refresh_from_db()
    two.refresh_from_db()
    assert (one.state, two.state) == ("succeeded", "succeeded")
    assert step(one, "child").child_workflow_id == step(two, "child").child_workflow_id
    assert Workflow.objects.filter(name="wf_child").count() == 1
    # the start run again (a worker lost after its commit) changes nothing: the step is no longer waiting
    again = child_steps.start_child(step(one, "child").id)
    assert again["started"] is False
    assert Workflow.objects.filter(name="wf_child").count() == 1


def test_a_start_that_finds_its_child_already_succeeded_ends_the_step_at_once():
    done = services.start("wf_child", {"x": 5}, key="shared-b")
    drive()
    w = services.start("wf_parent_keyed", {"k": "b"})
    drive()
    w.refresh_from_db()
    assert w.state == "succeeded"
    assert step(w, "child").child_workflow_id == done.id
    assert step(w, "total").result == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workflow": "nope"}, "unknown workflow 'nope'"),
        ({"workflow": "wf_child", "params": {"x": "many"}}, "step 'wf_child'"),
        ({"workflow": "wf_child", "key": "{missing}"}, "key template"),
        ({"workflow": "wf_child", "key": "a\x00b"}, "bad key"),
        ({"workflow": "self"}, "cannot start itself"),
    ],
)
def test_bad_sub_workflow_steps_are_refused_before_anything_is_written(kwargs, message):
    g = Graph("self")
    with pytest.raises(WorkflowDefinitionError, match=message):
        g.workflow(**kwargs)
    assert not Workflow.objects.exists()


def test_a_graph_built_in_code_can_hold_a_sub_workflow_step():
    g = Graph("adhoc")
    g.workflow("wf_child", {"x": 2}, name="c")
    w = services.start_graph(g)
    drive()
    w.refresh_from_db()
    assert w.state == "succeeded"
    assert step(w, "c").result["results"] == {"b": 3}


def test_a_backfill_as_children_runs_a_child_per_day_at_most_k_at_a_time_and_its_json_only_adds():
    from queue_app.workflows.definition import WorkflowError

    with pytest.raises(WorkflowError, match="only a workflow runs as child workflows"):
        services.backfill("wf.add", "2026-11-01", "2026-11-03", as_children=True)
    out = io.StringIO()
    call_command(
        "workflow", "backfill", "wf_daily", "--from", "2026-11-01", "--to", "2026-11-04",
        "--concurrency", "2", "--as-children", "--json", stdout=out,
    )  # fmt: skip
    shown = json.loads(out.getvalue())
    assert {"id", "name", "state", "attempt", "steps", "parent", "children"} <= shown.keys()
    assert [(s["name"], s["kind"], s["state"]) for s in shown["steps"]][:3] == [
        ("2026-11-01", "workflow", "waiting_child"),
        ("2026-11-02", "workflow", "waiting_child"),
        ("2026-11-03", "workflow", "waiting"),  # lane: after 2026-11-01
    ]
    w = Workflow.objects.get(id=shown["id"])
    assert w.params["as_children"] is True
    drive()
    w.refresh_from_db()
    assert w.state == "succeeded"
    kids = Workflow.objects.filter(name="wf_daily").order_by("id")
    assert [k.params["day"] for k in kids] == ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    assert {k.state for k in kids} == {"succeeded"}
    out = io.StringIO()
    call_command("workflow", "status", str(kids[0].id), stdout=out)
    assert f"parent: workflow {w.id} backfill wf_daily step '2026-11-01'" in out.getvalue()


def test_the_admin_links_parent_and_child_both_ways(django_user_model):
    from django.contrib.auth.models import Permission
    from django.test import Client
    from django.urls import reverse

    w = services.start("wf_parent", {"x": 3})
    drive()
    child = child_of(w)
    user = django_user_model.objects.create_user(username="flow", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="jobsite_workflows", codename="view_workflow")
    )
    client = Client()
    client.force_login(user)

    def page(workflow_id: int) -> str:
        response = client.get(reverse("admin:jobsite_workflows_workflow_change", args=[workflow_id]))
        assert response.status_code == 200
        return response.content.decode()

    child_url = reverse("admin:jobsite_workflows_workflow_change", args=[child.id])
    parent_url = reverse("admin:jobsite_workflows_workflow_change", args=[w.id])
    parent_page, child_page = page(w.id), page(child.id)
    assert f'<a href="{child_url}">wf_child #{child.id}</a>' in parent_page
    assert f'<a href="{parent_url}">wf_parent #{w.id}</a> at step <code>child</code>' in child_page
    assert parent_page.count(child_url) >= 2  # the children row and the graph's node of the step


@pytest.mark.django_db(transaction=True)
def test_parent_and_child_are_one_trace_the_childs_start_under_the_parents(traced):
    """The start item carries the parent's trace context and its handler runs under it (as a worker runs it), so
    the child's start span, and with it every item of the child, is in the parent's trace. A child started in its
    parent's start transaction (a first step's) is started under the parent's start span."""
    from queue_app.engine import tracing
    from queue_app.worker.execute import Job, run_job
    from tests.support.waiting import wait_for

    first = services.start("wf_parent_slow")
    first.refresh_from_db()
    _, first_trace, first_span, _ = first.trace_context.split("-")
    inline = child_of(first)
    assert inline.trace_context.split("-")[1] == first_trace
    w = services.start("wf_parent")
    w.refresh_from_db()
    _, trace_id, start_span_id, _ = w.trace_context.split("-")
    for held in engine.lease(None, 10, "otel-w", 60, traced=True):
        if held.task == "wf.add":  # wf_parent's "first" (the first child's wf.slow stays leased)
            engine.complete(held, 0)
    (held,) = engine.lease(None, 10, "otel-w", 60, traced=True)
    assert held.task == CHILD_START_TASK and held.trace_context == w.trace_context
    job = Job(
        held.reservation_id, held.item_id, held.queue, held.task, held.payload, 1, 3, "otel-w", held.trace_context
    )
    outcome = run_job(job)
    assert outcome.status == "settled", outcome  # transactional: handler and settle in one transaction
    connection.close()  # the worker's transactional run leaves this thread's connection closed
    child = child_of(w)
    assert child.trace_context.split("-")[1] == trace_id
    tracing.flush()
    spans = wait_for(
        lambda: [s for s in traced.spans() if s.trace_id == trace_id and s.name == "workflow wf_child"],
        20,
        what="the child's start span",
    )
    assert spans[0].parent_id == start_span_id  # here the item's context; a worker puts its attempt's span between
    (a,) = WorkflowStep.objects.filter(workflow_id=child.id, name="a")
    assert QueueItem.objects.get(id=a.item_id).trace_context.split("-")[1] == trace_id
    spans = wait_for(
        lambda: [s for s in traced.spans() if s.trace_id == first_trace and s.name == "workflow wf_child_slow"],
        20,
        what="the first step's child's start span",
    )
    assert spans[0].parent_id == first_span
    (slow,) = WorkflowStep.objects.filter(workflow_id=inline.id)
    assert QueueItem.objects.get(id=slow.item_id).trace_context.split("-")[1] == first_trace


def test_workflows_that_start_each_other_stop_at_the_depth_limit(monkeypatch):
    monkeypatch.setattr(children, "MAX_DEPTH", 4)  # 20 in production: the same path, fewer rounds
    w = services.start("wf_ping")
    drive()
    w.refresh_from_db()
    assert w.state == "failed"
    assert Workflow.objects.count() == children.MAX_DEPTH
    deepest = Workflow.objects.order_by("-id").first()
    failed = WorkflowStep.objects.get(workflow_id=deepest.id)
    assert failed.state == "failed" and "nest at most 4 deep" in failed.error


def test_a_spark_step_of_a_child_names_the_child_as_parent_run_and_the_top_as_root():
    """OpenLineage's parent run facet (datasets/spark_lineage.py): the run's workflow, and the root of its chain."""
    from queue_app.datasets.openlineage import run_id
    from queue_app.datasets.spark_lineage import _parent
    from queue_app.spark.models import SparkRun

    w = services.start("wf_grandparent")
    drive()
    parent = child_of(w, "parent")
    child = child_of(parent)
    a = WorkflowStep.objects.get(workflow_id=child.id, name="a")
    run = SparkRun.objects.create(job="queue_analytics", state="succeeded", trigger="workflow", item_id=a.item_id)
    WorkflowStep.objects.filter(id=a.id).update(spark_run_id=run.id)  # as if the child's step "a" were Spark's
    facet = _parent(run, "shop")
    assert (facet.run.runId, facet.job.name) == (run_id("workflow", child.id), "wf_child")
    assert (facet.root.run.runId, facet.root.job.name) == (run_id("workflow", w.id), "wf_grandparent")
