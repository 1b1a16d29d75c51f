"""Approvals (issue 39): `wf.approval(...)` is a human step. Decided in the admin's "Pending approvals" (a POST by
a user holding the step's permission), with `workflow approve|reject`, or `approvals.decide`; each decision is a
LogEntry, fenced by the step's timeout item (one decision wins; one after the timeout changes nothing)."""

import getpass
import json
import threading

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.urls import reverse

from queue_app.models import QueueItem
from queue_app.webhooks.models import WebhookEndpoint
from queue_app.workflows import WorkflowDefinitionError, approvals, services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.waiting import wait_for
from tests.tasks import workflow_waits_tasks  # noqa: F401  (registers wf_approve)

pytestmark = pytest.mark.django_db(transaction=True)
PENDING = "admin:jobsite_workflows_workflow_approvals"


@pytest.fixture
def worker(waits_worker):
    return waits_worker()


def staff(name: str, *perms: str) -> User:
    user = User.objects.create_user(name, password="password", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return User.objects.get(id=user.id)  # a fresh permission cache


def step(w: Workflow, name: str) -> WorkflowStep:
    return WorkflowStep.objects.get(workflow_id=w.id, attempt=Workflow.objects.get(id=w.id).attempt, name=name)


def states(w: Workflow) -> dict[str, str]:
    return {s["name"]: s["state"] for s in services.status(w.id)["steps"]}


def finished(w: Workflow, timeout: float = 90) -> Workflow:
    return wait_for(lambda: (x := Workflow.objects.get(id=w.id)).is_final and x, timeout, what=f"workflow {w.id}")


def waiting(w: Workflow) -> None:
    wait_for(lambda: states(w)["approve"] == "waiting_approval", 60, what="the approval to wait")


def listed(page, w: Workflow) -> bool:
    """Whether the pending approvals page offers a decision on `w`'s approval step."""
    return f'name="step" value="{step(w, "approve").id}"' in page.text


def logged(w: Workflow) -> list[tuple[str, str]]:
    return [(e.user.username, e.change_message) for e in LogEntry.objects.filter(object_id=str(w.id)).order_by("id")]


@pytest.mark.slow
def test_an_approval_given_in_the_admin_ends_the_wait_and_the_workflow_goes_on(worker, client, manage):
    w = services.start("wf_approve")
    waiting(w)
    shown = manage("workflow", "status", str(w.id), "--json")
    assert {s["name"]: s["state"] for s in json.loads(shown.stdout)["steps"]}["approve"] == "waiting_approval"
    boss = staff("boss", "jobsite_workflows.repair_workflow")
    client.force_login(boss)
    page = client.get(reverse(PENDING))
    assert page.status_code == 200 and listed(page, w) and 'name="csrfmiddlewaretoken"' in page.text
    assert states(w)["approve"] == "waiting_approval"  # a GET changed nothing
    done = client.post(reverse(PENDING), {"step": step(w, "approve").id, "decision": "approve", "comment": "ok"})
    assert done.status_code == 302
    assert finished(w).state == "succeeded"
    approved = {"approved": True, "by": "boss", "comment": "ok"}
    assert step(w, "approve").result == approved
    assert step(w, "use").result == {"approve": approved}
    assert logged(w) == [("boss", "Approved step 'approve': ok")]
    assert not listed(client.get(reverse(PENDING)), w)


@pytest.mark.slow
def test_a_rejection_fails_the_step_and_runs_the_compensations(worker, manage):
    w = services.start("wf_approve")
    waiting(w)
    User.objects.create_superuser("chief", password="password")
    out = manage("workflow", "reject", str(w.id), "--step", "approve", "--comment", "too much", "--user", "chief")
    assert out.returncode == 0, out.stderr
    assert finished(w).state == "failed"
    rejected = step(w, "approve")
    assert rejected.state == "failed" and rejected.error == "rejected by chief: too much"
    assert rejected.result == {"approved": False, "by": "chief", "comment": "too much"}
    assert step(w, "use").state == "cancelled"
    assert step(w, "undo first").state == "succeeded"  # the compensation of the step before it ran
    assert logged(w) == [("chief", "Rejected step 'approve': too much")]


@pytest.mark.slow
def test_a_user_without_the_permission_gets_403_and_nothing_changes(worker, client):
    w = services.start("wf_approve")
    waiting(w)
    clerk = staff("clerk", "jobsite_workflows.start_workflow")
    client.force_login(clerk)
    assert not listed(client.get(reverse(PENDING)), w)  # not listed for them
    refused = client.post(reverse(PENDING), {"step": step(w, "approve").id, "decision": "approve"})
    assert refused.status_code == 403
    with pytest.raises(approvals.ApprovalDenied, match="jobsite_workflows.repair_workflow"):
        approvals.decide(step(w, "approve").id, clerk, True)
    item = QueueItem.objects.get(id=step(w, "approve").item_id)
    assert item.state == "ready" and states(w)["approve"] == "waiting_approval"
    assert not LogEntry.objects.exists()
    # The one who may decide still can: the refusal left the wait as it was.
    approvals.decide(step(w, "approve").id, staff("boss", "jobsite_workflows.repair_workflow"), True)
    assert finished(w).state == "succeeded"


@pytest.mark.slow
def test_a_second_decision_changes_nothing_and_says_so(worker, manage):
    w = services.start("wf_approve")
    waiting(w)
    boss = staff("boss", "jobsite_workflows.repair_workflow")
    approvals.decide(step(w, "approve").id, boss, True, "first")
    with pytest.raises(approvals.NotWaiting, match="already approved by boss"):
        approvals.decide(step(w, "approve").id, boss, False, "second")
    again = manage("workflow", "reject", str(w.id), "--step", "approve", "--user", "boss")
    assert again.returncode == 1 and "already approved by boss" in again.stderr
    assert finished(w).state == "succeeded"
    assert step(w, "approve").result == {"approved": True, "by": "boss", "comment": "first"}
    assert logged(w) == [("boss", "Approved step 'approve': first")]


@pytest.mark.slow
def test_a_timeout_fails_the_approval_and_a_late_decision_changes_nothing(worker):
    w = services.start("wf_approve", {"timeout": 0.5, "policy": "fail"})
    assert finished(w).state == "failed"
    timed_out = step(w, "approve")
    # the stored error as the docs quote it (workflow-waits.md), the exception's class first
    assert (
        timed_out.state == "failed" and timed_out.error == "ApprovalTimeout: nobody approved or rejected within 0.5 s"
    )
    assert step(w, "undo first").state == "succeeded"
    with pytest.raises(approvals.NotWaiting, match="timed out"):
        approvals.decide(timed_out.id, staff("boss", "jobsite_workflows.repair_workflow"), True)
    assert not LogEntry.objects.exists()


@pytest.mark.slow
def test_a_timeout_with_continue_goes_on_without_a_decision(worker):
    w = services.start("wf_approve", {"timeout": 0.5, "policy": "continue"})
    assert finished(w).state == "succeeded"
    assert step(w, "use").result == {"approve": {"approved": None, "timed_out": True}}


@pytest.mark.slow
def test_the_cli_approves_as_the_user_named_and_refuses_unknown_steps_and_users(worker, manage):
    w = services.start("wf_approve")
    waiting(w)
    staff("boss", "jobsite_workflows.repair_workflow")
    for args, said in (
        (("999999", "--step", "approve", "--user", "boss"), "no workflow 999999"),
        ((str(w.id), "--step", "nope", "--user", "boss"), "has no step 'nope'"),
        ((str(w.id), "--step", "first", "--user", "boss"), "not an approval"),
        ((str(w.id), "--step", "approve", "--user", "ghost"), "no Django user 'ghost'"),
    ):
        out = manage("workflow", "approve", *args)
        assert out.returncode == 1 and said in out.stderr, (args, out.stderr)
    assert states(w)["approve"] == "waiting_approval"
    out = manage("workflow", "approve", str(w.id), "--step", "approve", "--comment", "fine", "--user", "boss", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "workflow_id": w.id,
        "step": "approve",
        "step_id": step(w, "approve").id,
        "approved": True,
        "by": "boss",
        "comment": "fine",
    }
    assert finished(w).state == "succeeded"
    assert logged(w) == [("boss", "Approved step 'approve': fine")]


def test_an_approval_step_publishes_approval_requested_when_it_starts_waiting():
    WebhookEndpoint.objects.create(
        url="https://example.com/hook", secret="whsec_test", event_types=["workflow.approval_requested"]
    )
    g = Graph("needs-approval")
    g.approval("ok", permission="jobsite_workflows.repair_workflow", timeout=600)
    w = services.start_graph(g)
    assert states(w) == {"ok": "waiting_approval"}
    (published,) = QueueItem.objects.filter(task="queue_app.webhook_publish")
    assert published.payload["type"] == "workflow.approval_requested"
    data = published.payload["data"]
    assert (data["workflow_id"], data["step"], data["permission"], data["timeout"]) == (
        w.id,
        "ok",
        "jobsite_workflows.repair_workflow",
        600.0,
    )
    assert data["expires_at"] is not None


def test_no_endpoint_no_event_item():
    g = Graph("needs-approval")
    g.approval("ok", permission="jobsite_workflows.repair_workflow")
    w = services.start_graph(g)
    assert states(w) == {"ok": "waiting_approval"}
    assert not QueueItem.objects.filter(task="queue_app.webhook_publish").exists()


def test_a_refusal_says_why_an_inactive_user_is_told_so_and_the_admin_logs_one_warning_line(client, caplog):
    g = Graph("refusals")
    g.approval("ok", permission="jobsite_workflows.repair_workflow", timeout=600)
    g.wait_event("paid", event="partner.callback", key="k", timeout=600)
    w = services.start_graph(g)
    former = staff("former", "jobsite_workflows.repair_workflow")
    former.is_active = False
    former.save()
    with pytest.raises(approvals.ApprovalDenied) as refused:
        approvals.decide(step(w, "ok").id, former, True)
    assert str(refused.value) == f"'former' may not decide step 'ok' of workflow {w.id}: the user is inactive"
    with pytest.raises(approvals.ApprovalError) as wrong:
        approvals.find(w.id, "paid")
    assert str(wrong.value) == f"step 'paid' of workflow {w.id} is an event step, not an approval"

    client.force_login(staff("clerk", "jobsite_workflows.start_workflow"))
    with caplog.at_level("INFO"):
        page = client.post(reverse(PENDING), {"step": step(w, "ok").id, "decision": "approve"})
    needs = (
        f"'clerk' may not decide step 'ok' of workflow {w.id}: "
        "it needs the permission 'jobsite_workflows.repair_workflow'"
    )
    assert page.status_code == 403
    said = [(r.levelname, r.name, r.getMessage(), r.exc_info) for r in caplog.records if r.levelno >= 30]
    assert said == [("WARNING", "jobsite.workflows", f"approval refused: {needs}", None)]
    assert states(w)["ok"] == "waiting_approval" and not LogEntry.objects.exists()


def test_bad_approval_definitions_are_refused():
    g = Graph("bad")
    for kwargs, said in (
        ({"permission": "nodot"}, "app_label.codename"),
        ({"permission": "queue_app.no_such_permission"}, "no permission"),
        ({"permission": "jobsite_workflows.repair_workflow", "timeout": 0}, "timeout"),
        ({"permission": "jobsite_workflows.repair_workflow", "on_timeout": "maybe"}, "on_timeout"),
    ):
        with pytest.raises(WorkflowDefinitionError, match=said):
            g.approval("ok", **kwargs)
    assert not g.steps


@pytest.mark.slow
def test_the_cli_decides_as_the_django_user_named_like_the_os_login_when_no_user_is_given(worker, manage):
    w = services.start("wf_approve")
    waiting(w)
    login = getpass.getuser()
    out = manage("workflow", "reject", str(w.id), "--step", "approve")
    assert out.returncode == 1 and f"no Django user {login!r}" in out.stderr  # none yet: refused
    assert states(w)["approve"] == "waiting_approval"
    User.objects.create_superuser(login, password="password")
    out = manage("workflow", "reject", str(w.id), "--step", "approve", "--comment", "no")
    assert out.returncode == 0, out.stderr
    assert finished(w).state == "failed"
    assert logged(w) == [(login, "Rejected step 'approve': no")]


def test_two_decisions_at_once_one_wins_and_the_other_is_told():
    g = Graph("race")
    g.approval("ok", permission="jobsite_workflows.repair_workflow")
    w = services.start_graph(g)
    ok = WorkflowStep.objects.get(workflow_id=w.id, name="ok")
    deciders = [staff("alice", "jobsite_workflows.repair_workflow"), staff("bob", "jobsite_workflows.repair_workflow")]
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def decide(user: User, approve: bool) -> None:
        try:
            barrier.wait(30)
            approvals.decide(ok.id, user, approve)
            outcomes[user.username] = "decided"
        except approvals.NotWaiting as exc:
            outcomes[user.username] = str(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(u, u.username == "alice")) for u in deciders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winner = next(name for name, said in outcomes.items() if said == "decided")
    loser = next(name for name in outcomes if name != winner)
    assert f"already {'approved' if winner == 'alice' else 'rejected'} by {winner}" in outcomes[loser]
    assert logged(w) == [(winner, f"{'Approved' if winner == 'alice' else 'Rejected'} step 'ok'")]
    assert Workflow.objects.get(id=w.id).state == ("succeeded" if winner == "alice" else "failed")
