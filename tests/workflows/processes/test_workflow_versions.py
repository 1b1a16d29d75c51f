"""Versions, forks and deadlines of workflows (issue 39), with real workers where a guarantee is claimed: a run
keeps the graph it started with and records its version; repair re-runs the stored graph, or the current
definition when asked; a fork re-runs a step and what is downstream of it and keeps the rest; a step whose task no
longer exists fails with a clear error; a workflow's and a step's deadline cancel what is open and fail the
workflow (compensations run); bad input is a clear error with nothing written."""

import datetime as dt
import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from queue_app import engine
from queue_app.models import ProbeEffect, QueueItem
from queue_app.registry import job
from queue_app.workflows import WorkflowDefinitionError, WorkflowError, deadlines, services, versions
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep, WorkflowVersion
from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401 (autouse)
from tests.support.waiting import wait_for
from tests.tasks import workflow_versions_tasks  # noqa: F401  (registers wfv_* and their tasks)

pytestmark = pytest.mark.django_db(transaction=True)


@job("wfv.gone")
def gone(payload, ctx):
    """Registered in this process only: to the worker, a task that no longer exists."""


@pytest.fixture
def versions_worker(spawn):
    def start(concurrency: int = 4):
        return spawn(
            "run_worker",
            "--concurrency",
            str(concurrency),
            "--pool",
            "thread",
            "--import",
            "tests.tasks.workflow_versions_tasks",
            "--poll-interval",
            "0.2",
        )

    return start


def finished(w: Workflow, timeout: float = 90) -> Workflow:
    return wait_for(lambda: (x := Workflow.objects.get(id=w.id)).is_final and x, timeout, what=f"workflow {w.id}")


def steps(w: Workflow) -> dict[str, WorkflowStep]:
    w = Workflow.objects.get(id=w.id)
    return {s.name: s for s in WorkflowStep.objects.filter(workflow=w, attempt=w.attempt)}


def cli(*args: str) -> dict:
    from io import StringIO

    out = StringIO()
    call_command("workflow", *args, stdout=out)
    return json.loads(out.getvalue())


# -- with real workers ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fork_at_a_step_keeps_upstream_results_and_reruns_it_and_downstream(versions_worker):
    versions_worker()
    w = services.start("wfv_chain")
    assert finished(w).state == "succeeded"
    before = steps(w)
    out = cli("fork", str(w.id), "--from", "b", "--wait", "--json")
    assert out["state"] == "succeeded" and out["forked_from"] == w.id and out["fork_step"] == "b"
    forked = Workflow.objects.get(id=out["id"])
    assert (forked.name, forked.version, forked.attempt) == ("wfv_chain", Workflow.objects.get(id=w.id).version, 1)
    after = steps(forked)
    for name in ("a", "side"):  # upstream of b, and beside it: copied with their results, not run
        assert after[name].kept and after[name].result == before[name].result
        assert after[name].item_id == before[name].item_id
    for name in ("b", "c"):  # b and what is downstream of it: run again
        assert not after[name].kept and after[name].state == "succeeded"
        assert after[name].item_id != before[name].item_id and after[name].result != before[name].result
    assert after["c"].result["upstream"] == ["b", "side"]
    assert Workflow.objects.get(id=w.id).state == "succeeded"  # the source is left as it was


@pytest.mark.slow
def test_repair_reruns_the_stored_graph_or_the_current_definition_when_asked(versions_worker):
    w1, w2 = services.start("wfv_versioned"), services.start("wfv_versioned")
    v1 = w1.version
    assert v1 == w2.version and len(v1) == 16
    versions_worker()
    assert finished(w1).state == "failed" and finished(w2).state == "failed"
    ProbeEffect.objects.create(key="wfv-v2")  # the definition changes: a new step d
    ProbeEffect.objects.create(key="wfv-fixed")
    a1 = steps(w1)["a"].result

    stored = cli("repair", str(w1.id), "--wait", "--json")
    assert stored["state"] == "succeeded" and stored["version"] == v1
    assert sorted(s["name"] for s in stored["steps"]) == ["a", "b", "c"]  # the graph it started with
    assert steps(w1)["a"].kept and steps(w1)["a"].result == a1

    current = cli("repair", str(w2.id), "--onto-current", "--wait", "--json")
    assert current["state"] == "succeeded" and current["version"] != v1
    assert sorted(s["name"] for s in current["steps"]) == ["a", "b", "c", "d"]
    now = steps(w2)
    assert now["a"].kept and not now["d"].kept and now["d"].result["upstream"] == ["b"]
    shapes = {v.version: v.shape for v in WorkflowVersion.objects.filter(name="wfv_versioned")}
    assert set(shapes) == {v1, current["version"]}
    changes = {c.name: c.change for c in versions.diff(shapes[v1], shapes[current["version"]])}
    assert changes == {"a": "same", "b": "same", "c": "same", "d": "added"}


@pytest.mark.slow
def test_a_step_whose_task_no_longer_exists_fails_with_a_clear_error(versions_worker):
    g = Graph("vanishing")
    g.task("wfv.stamp", name="first")
    g.task("wfv.gone", name="gone", after=["first"])  # the worker has no such task
    w = services.start_graph(g)
    versions_worker()
    assert finished(w).state == "failed"
    step = steps(w)["gone"]
    assert step.state == "failed" and "unknown task: wfv.gone" in step.error
    assert Workflow.objects.get(id=w.id).error == "failed at step gone"


@pytest.mark.slow
def test_a_workflow_deadline_and_a_step_deadline_cancel_what_is_open(versions_worker):
    versions_worker()
    up = engine.enqueue("queue_app.noop")  # the worker is up: the first steps finish well before the deadlines
    wait_for(lambda: QueueItem.objects.get(id=up.id).state == "done", 60, what="the worker to start")
    g = Graph("late")
    first = g.task("wfv.stamp", name="first", compensate="wf.undo")
    g.wait_event("paid", event="wfv.never", key="k", timeout=3600, after=[first])
    g.deadline(seconds=2)
    late = services.start_graph(g)
    h = Graph("slow step")
    first = h.task("wfv.stamp", name="first", compensate="wf.undo")
    slow = h.task("wf.slow", {"seconds": 60}, name="slow", after=[first])
    h.task("wfv.stamp", name="never", after=[slow])
    h.deadline(slow, seconds=1)
    stuck = services.start_graph(h)
    assert late.deadline_at is not None and stuck.deadline_at is None

    late = finished(late, 60)
    assert late.state == "failed" and "deadline passed" in late.error
    s = steps(late)
    assert s["paid"].state == "cancelled" and "deadline" in s["paid"].error
    assert s["undo first"].state == "succeeded"  # the compensation ran

    stuck = finished(stuck, 60)
    s = steps(stuck)
    assert stuck.state == "failed" and s["slow"].state == "cancelled" and "deadline of step 'slow'" in s["slow"].error
    assert s["never"].state == "cancelled" and s["undo first"].state == "succeeded"
    assert (s["slow"].finished_at - s["slow"].ready_at).total_seconds() < 30  # stopped, not run to its end


# -- in process: semantics of the services, bad input -------------------------------------------------------


def cancelled(name: str = "wfv_chain") -> Workflow:
    w = services.start(name)
    assert services.cancel(w.id, actor="test")
    return Workflow.objects.get(id=w.id)


def test_each_run_records_its_version_declared_or_the_graphs_fingerprint():
    w = services.start("wfv_chain")
    again = services.start("wfv_chain")
    assert w.version == again.version == WorkflowVersion.objects.get(name="wfv_chain").version
    shape = WorkflowVersion.objects.get(name="wfv_chain").shape
    assert shape["c"] == {
        "kind": "task",
        "target": "wfv.stamp",
        "after": ["b", "side"],
        "on_failure": "fail",
        "compensate": None,
        "deadline": None,
    }
    g = Graph("adhoc")
    g.task("wfv.stamp", name="x")
    assert services.start_graph(g).version == versions.fingerprint(versions.shape(g))
    # the steps are rows: a run keeps its graph (the definition's code is not read again)
    assert set(steps(w)) == {"a", "b", "side", "c"} and steps(w)["c"].spec["task"] == "wfv.stamp"


def test_a_versions_shape_carries_its_conditions_so_a_changed_rule_is_a_new_version():
    def graph(rule: str) -> Graph:
        g = Graph("conditioned")
        check = g.task("wfv.stamp", name="check")
        route = g.branch("route", on=check, path="go", op="truthy", then=["yes"], otherwise=["no"])
        g.task("wfv.stamp", name="yes", after=[route])
        g.task("wfv.stamp", name="no", after=[route])
        g.task("wfv.stamp", name="end", after=["yes", "no"], run_if=rule)
        g.order()  # marks the conditional steps in their specs, as a start does
        return g

    before, after = versions.shape(graph("none_failed")), versions.shape(graph("all_done"))
    assert before["route"]["branch"] == ["yes", "no"] and before["yes"]["run_if"] == "all_succeeded"
    assert "run_if" not in before["check"]  # a step with no condition: the shape it had before conditions
    assert versions.fingerprint(before) != versions.fingerprint(after)
    changed = [c for c in versions.diff(before, after) if c.change != "same"]
    assert [(c.name, c.fields) for c in changed] == [("end", (("run_if", "none_failed", "all_done"),))]


def test_a_current_definition_naming_a_removed_task_is_refused_and_nothing_written():
    w = cancelled("wfv_versioned")
    ProbeEffect.objects.create(key="wfv-v3")  # the definition now names the task wfv.removed, which is not there
    with pytest.raises(WorkflowDefinitionError, match="unknown task 'wfv.removed'"):
        services.repair(w.id, onto_current=True)
    assert Workflow.objects.get(id=w.id).attempt == 1 and not WorkflowStep.objects.filter(attempt=2).exists()
    assert services.repair(w.id).attempt == 2  # the stored graph still runs


def test_fork_bad_input_is_a_clear_error_and_writes_nothing():
    w = cancelled()
    count = Workflow.objects.count()
    with pytest.raises(
        WorkflowError, match=r"no step 'nope' in workflow \d+ \(wfv_chain\) \(its steps: a, b, c, side\)"
    ):
        services.fork(w.id, "nope")
    with pytest.raises(WorkflowError, match="no step 'nope' in the current definition"):
        services.fork(w.id, "nope", onto_current=True)
    running = services.start("wfv_chain")
    with pytest.raises(WorkflowError, match="is running: only a finished one can be forked"):
        services.fork(running.id, "b")
    with pytest.raises(WorkflowError, match="no workflow 999999"):
        services.fork(999999, "b")
    with pytest.raises(CommandError, match="no step 'nope'.*nothing was written"):
        call_command("workflow", "fork", str(w.id), "--from", "nope", "--json")
    assert Workflow.objects.count() == count + 1  # only the running one started above


def test_fork_onto_the_current_definition_runs_its_new_steps():
    w = cancelled("wfv_versioned")
    ProbeEffect.objects.create(key="wfv-v2")
    forked = services.fork(w.id, "b", onto_current=True, actor="test")
    assert set(steps(forked)) == {"a", "b", "c", "d"} and forked.version != w.version
    assert (forked.forked_from, forked.fork_step, forked.started_by) == (w.id, "b", "test")
    stored = services.fork(w.id, "b")
    assert set(steps(stored)) == {"a", "b", "c"} and stored.version == w.version


def test_a_deadline_in_the_past_is_a_clear_error_and_writes_nothing():
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    items, flows = QueueItem.objects.count(), Workflow.objects.count()
    with pytest.raises(WorkflowDefinitionError, match="workflow deadline: .* is in the past"):
        services.start("wfv_chain", deadline=past)
    g = Graph("late")
    a = g.task("wfv.stamp", name="a")
    with pytest.raises(WorkflowDefinitionError, match="deadline of step 'a': .* is in the past"):
        g.deadline(a, at=past)
    with pytest.raises(WorkflowDefinitionError, match="seconds must be a number above 0"):
        g.deadline(seconds=0)
    with pytest.raises(WorkflowDefinitionError, match="no such step"):
        g.deadline("nope", seconds=5)
    with pytest.raises(WorkflowDefinitionError, match="timezone-aware"):
        services.start("wfv_chain", deadline=dt.datetime(2099, 1, 1))
    assert (QueueItem.objects.count(), Workflow.objects.count()) == (items, flows)


def test_a_deadline_acts_once_and_only_on_what_is_still_open():
    g = Graph("late")
    g.wait_event("paid", event="wfv.never", key="k", timeout=3600)
    g.deadline("paid", seconds=600)
    w = services.start_graph(g, deadline=dt.timedelta(hours=1))
    marks = QueueItem.objects.filter(task="queue_app.workflow_deadline")
    assert {tuple(sorted(m.payload)) for m in marks} == {
        ("attempt", "workflow_id"),
        ("attempt", "step", "step_id", "workflow_id"),
    }
    step_id = steps(w)["paid"].id
    assert not deadlines.passed(w.id, 2, step_id)  # another attempt's: nothing
    assert deadlines.passed(w.id, 1, step_id)
    assert not deadlines.passed(w.id, 1, step_id)  # twice: the second changes nothing
    w = Workflow.objects.get(id=w.id)
    assert w.state == "failed" and steps(w)["paid"].state == "cancelled"
    assert not deadlines.passed(w.id, 1)  # the workflow has ended


def test_admin_versions_page_and_fork_behind_the_start_permission(django_user_model):
    w = cancelled("wfv_versioned")
    ProbeEffect.objects.create(key="wfv-v2")
    user = django_user_model.objects.create_user(username="v", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_workflow"]))
    client = Client()
    client.force_login(user)
    html = client.get(reverse("admin:jobsite_workflows_workflow_versions", args=[w.id])).content.decode()
    assert "<svg" in html and "change-added" in html and "1 step differs" not in html
    assert '<tr class="change-added">' in html and "<th>d</th>" in html
    page = reverse("admin:jobsite_workflows_workflow_fork", args=[w.id])
    assert client.get(page).status_code == 200
    assert client.post(page, {"step": "b"}).status_code == 403  # no start permission
    user.user_permissions.add(Permission.objects.get(codename="start_workflow"))
    client.force_login(django_user_model.objects.get(id=user.id))
    response = client.post(page, {"step": "b", "onto_current": "on"})
    forked = Workflow.objects.exclude(id=w.id).get()
    assert response.status_code == 302 and forked.forked_from == w.id and "d" in steps(forked)
    entry = LogEntry.objects.get(object_id=str(forked.id))
    assert entry.change_message == f"Forked from #{w.id} at step 'b' (the current definition)"
    assert client.post(page, {"step": "nope"}).status_code == 400
    detail = client.get(reverse("admin:jobsite_workflows_workflow_change", args=[forked.id])).content.decode()
    assert f"#{w.id}</a> at step <code>b</code>" in detail and forked.version in detail


def test_admin_repair_onto_the_current_definition_is_its_own_confirmed_action(django_user_model):
    w = cancelled("wfv_versioned")
    ProbeEffect.objects.create(key="wfv-v2")
    user = django_user_model.objects.create_user(username="r", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_workflow"]))
    client = Client()
    client.force_login(user)
    page = reverse("admin:jobsite_workflows_workflow_repair-current", args=[w.id])
    assert client.post(page).status_code == 403 and Workflow.objects.get(id=w.id).attempt == 1
    user.user_permissions.add(Permission.objects.get(codename="repair_workflow"))
    client.force_login(django_user_model.objects.get(id=user.id))
    assert "onto the definition as the code has it now" in client.get(page).content.decode()
    assert client.post(page).status_code == 302
    repaired = Workflow.objects.get(id=w.id)
    assert repaired.attempt == 2 and repaired.version != w.version and "d" in steps(repaired)
    assert LogEntry.objects.get(object_id=str(w.id)).change_message.startswith("Repaired onto the current definition")
