"""Conditions with real workers (issue 39): branches decided on a step's result and skipping that propagates,
each run-if rule, and the shipped demo `demo_waits` walked end to end (the event sent from another process with
`manage.py workflow send-event`, the approval given in the admin)."""

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from queue_app.workflows import services
from queue_app.workflows.models import Workflow
from tests.support.waiting import wait_for
from tests.tasks import workflow_condition_tasks  # noqa: F401  (registers wf_branch, wf_rules)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
PENDING = "admin:jobsite_workflows_workflow_approvals"


@pytest.fixture
def worker(spawn):
    def start(module: str = "tests.tasks.workflow_condition_tasks"):
        return spawn(
            "run_worker", "--concurrency", "4", "--pool", "thread", "--import", module, "--poll-interval", "0.2"
        )

    return start


def finished(w: Workflow, timeout: float = 90) -> Workflow:
    return wait_for(lambda: (x := Workflow.objects.get(id=w.id)).is_final and x, timeout, what=f"workflow {w.id}")


def states(w: Workflow) -> dict[str, str]:
    return {s["name"]: s["state"] for s in services.status(w.id)["steps"]}


def results(w: Workflow) -> dict[str, object]:
    return dict(w.steps.filter(attempt=Workflow.objects.get(id=w.id).attempt).values_list("name", "result"))


def test_branches_and_rules_decided_by_real_workers(worker, manage):
    big = services.start("wf_branch", {"amount": 120})
    small = services.start("wf_branch", {"amount": 5})
    rules = services.start("wf_rules")
    worker()
    assert finished(big).state == "succeeded"
    assert states(big) == {
        "check": "succeeded",
        "route": "succeeded",
        "big": "succeeded",
        "small": "skipped",
        "below_small": "skipped",
        "end": "succeeded",
        "after_end": "succeeded",
    }
    assert results(big)["route"] == {"chosen": ["big"], "value": 120, "matched": True}
    assert results(big)["end"] == 11  # 10 + big's 1: the skipped below_small gave nothing
    assert finished(small).state == "succeeded"
    assert {n: s for n, s in states(small).items() if n in ("big", "small", "below_small", "end")} == {
        "big": "skipped",
        "small": "succeeded",
        "below_small": "succeeded",
        "end": "succeeded",
    }
    # bad failed (on_failure continue): the workflow ends failed once every step ended, per each rule
    assert finished(rules).state == "failed"
    assert states(rules) == {
        "ok": "succeeded",
        "bad": "failed",
        "all_succeeded": "succeeded",  # a failure with on_failure="continue" lets its dependents run, as before
        "all_done": "succeeded",
        "any_failed": "succeeded",
        "none_failed": "skipped",
    }
    shown = json.loads(manage("workflow", "status", str(big.id), "--json").stdout)
    assert {s["name"]: s["state"] for s in shown["steps"]}["small"] == "skipped"


def test_demo_waits_walked_from_the_cli_and_the_admin(worker, manage, client):
    started = manage("workflow", "start", "demo_waits", "--param", "order=walk-1", "--json")
    assert started.returncode == 0, started.stderr
    w = Workflow.objects.get(id=json.loads(started.stdout)["id"])
    worker("queue_app.tasks")
    assert states(w)["nap"] in ("sleeping", "running", "succeeded")
    wait_for(lambda: states(w)["paid"] == "waiting_event", 30, what="paid to wait for demo.paid")
    sent = manage("workflow", "send-event", "demo.paid", "--key", "walk-1", "--payload", '{"amount": 150}', "--json")
    assert sent.returncode == 0 and json.loads(sent.stdout)["matched"] is True, sent.stdout + sent.stderr
    wait_for(lambda: states(w)["approve"] == "waiting_approval", 30, what="the approval to wait")
    boss = User.objects.create_user("boss", password="pw", is_staff=True)
    boss.user_permissions.add(
        Permission.objects.get(content_type__app_label="jobsite_workflows", codename="start_workflow")
    )
    client.force_login(User.objects.get(id=boss.id))
    approve_id = w.steps.get(name="approve").id
    done = client.post(reverse(PENDING), {"step": approve_id, "decision": "approve", "comment": "ok"})
    assert done.status_code == 302
    assert finished(w).state == "succeeded"
    assert states(w) == {
        "nap": "succeeded",
        "paid": "succeeded",
        "approve": "succeeded",
        "route": "succeeded",
        "big": "succeeded",
        "small": "skipped",
        "summary": "succeeded",
    }
    assert results(w)["summary"] == {"order": "walk-1", "big": {"order": "walk-1", "handled_as": "big"}}
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get(reverse("admin:jobsite_workflows_workflow_change", args=[w.id]))
    assert page.status_code == 200 and "skipped" in page.content.decode()
