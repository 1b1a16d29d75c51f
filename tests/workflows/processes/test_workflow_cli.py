"""`manage.py workflow ...` as a user runs it: real child processes, real workers, JSON a script can read."""

import json

import pytest

from queue_app.workflows.models import Workflow, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)
IMPORT = ("--import", "tests.tasks.workflow_tasks")


@pytest.fixture
def worker(spawn):
    return spawn("run_worker", "--concurrency", "4", "--pool", "thread", "--import", "tests.tasks.workflow_tasks")


def test_list_json_names_the_registered_workflows_with_their_params(manage):
    out = manage("workflow", "list", "--json")
    assert out.returncode == 0, out.stderr
    listed = {w["name"]: w for w in json.loads(out.stdout)}
    assert "demo_pipeline" in listed
    assert listed["demo_pipeline"]["params"][0]["name"] == "day"


@pytest.mark.slow
def test_start_wait_json_prints_every_step_and_exits_0_on_success(manage, worker):
    out = manage("workflow", *IMPORT, "start", "wf_diamond", "--wait", "--json")
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["state"] == "succeeded"
    assert {s["name"]: s["state"] for s in status["steps"]} == dict.fromkeys("abcd", "succeeded")
    assert Workflow.objects.get(id=status["id"]).state == "succeeded"
    text = manage("workflow", "status", str(status["id"])).stdout.splitlines()  # each step's result, as --json
    for step in status["steps"]:
        said = [line for line in text if line.split()[1:2] == [step["name"]]]
        assert said and said[0].endswith(f"  result: {json.dumps(step['result'])}"), (step, text)


@pytest.mark.slow
def test_wait_exits_1_when_the_workflow_fails_and_repair_reruns_it(manage, worker):
    out = manage("workflow", *IMPORT, "start", "wf_fails", "--wait", "--json")
    assert out.returncode == 1
    status = json.loads(out.stdout)
    assert status["state"] == "failed"
    failed = [step for step in status["steps"] if step["error"]]
    assert failed and out.stderr == ""  # --json: no INFO lines on stderr
    text = manage("workflow", "status", str(status["id"])).stdout  # the text shows the step's error, as --json
    assert f"error: {' '.join(failed[0]['error'].split())[:100]}" in text
    from queue_app.models import ProbeEffect

    ProbeEffect.objects.create(key="fixed")
    again = manage("workflow", *IMPORT, "repair", str(status["id"]), "--wait", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["state"] == "succeeded"
    shown = manage("workflow", "status", str(status["id"]), "--json")
    assert json.loads(shown.stdout)["attempt"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("start", "no_such"), "unknown workflow"),
        (("start", "demo_pipeline", "--param", "day=tuesday"), "day"),
        (("start", "demo_pipeline", "--param", "novalue"), "NAME=VALUE"),
        (("backfill", "file_rollup", "--from", "2026-02-01", "--to", "2026-01-01"), "after"),
        (("backfill", "queue_app.noop", "--from", "2020-01-01", "--to", "2026-01-01"), "--force"),
        (("backfill", "nothing.at.all", "--from", "2026-01-01", "--to", "2026-01-02"), "unknown task"),
        (("status", "999999"), "no workflow"),
        (("cancel", "999999"), "no workflow 999999"),
    ],
)
def test_bad_input_is_an_error_message_exit_1_and_nothing_written(manage, args, message):
    out = manage("workflow", *args)
    assert out.returncode == 1
    assert message in out.stderr
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists()


def test_cancel_json_cancels_what_has_not_started_as_the_admin_does_and_exits_0_once_ended(manage):
    from queue_app.models import QueueItem
    from queue_app.workflows import services
    from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_diamond in this process too)

    w = services.start("wf_diamond")  # no worker: a's item stays ready, the others wait
    out = manage("workflow", *IMPORT, "cancel", str(w.id), "--json")
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert (status["id"], status["state"], status["cancelled"]) == (w.id, "cancelled", True)
    assert {s["name"]: s["state"] for s in status["steps"]} == dict.fromkeys("abcd", "cancelled")
    assert Workflow.objects.get(id=w.id).error == "cancelled by cli"
    assert list(QueueItem.objects.filter(workflow_step_id__isnull=False).values_list("state", flat=True)) == [
        "cancelled"
    ]
    again = manage("workflow", "cancel", str(w.id), "--json")  # already ended: nothing to do, still exit 0
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["state"], json.loads(again.stdout)["cancelled"]) == ("cancelled", False)
    text = manage("workflow", "cancel", str(w.id))
    assert text.returncode == 0 and "was not cancelled: it is cancelled already" in text.stdout


def test_up_lists_the_workflows_right_after_it_is_up():
    from io import StringIO

    from jobsite.management.commands.up import Command

    out = StringIO()
    Command(stdout=out).say_workflows()
    assert "demo_pipeline" in out.getvalue() and "workflow start demo_pipeline" in out.getvalue()
