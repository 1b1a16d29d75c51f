"""Workflow steps that are Spark runs, through real workers and real spark-submit children: a Spark step's
metrics are its result, and cancelling the workflow stops a running Spark step."""

import pytest

from queue_app.datasets.models import Materialization
from queue_app.spark.models import SparkRun
from queue_app.spark.watch import group_members
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.spark_fixtures import require_spark
from tests.support.spark_workers import worker_env
from tests.support.waiting import wait_for
from tests.tasks import workflow_tasks  # noqa: F401  (registers the wf.* tasks)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # real workers


@pytest.fixture(autouse=True)
def _spark_available():
    require_spark()


@pytest.fixture
def workers(spawn):
    env = worker_env()
    return [
        spawn(
            "run_worker",
            "--queues",
            queues,
            "--concurrency",
            "2",
            "--pool",
            "thread",
            "--poll-interval",
            "0.3",
            "--import",
            "tests.tasks.workflow_tasks",
            env=env,
        )
        for queues in ("spark", "default")
    ]


def _start(graph: Graph) -> Workflow:
    return services.start_graph(graph, started_by="test")


def test_a_spark_steps_metrics_are_passed_to_the_next_step(workers):
    g = Graph("spark-results")
    run = g.spark("demo_sleep", {"tasks": 3, "seconds": 0.2}, name="sleep")
    g.task("wf.add", {"x": 0}, name="after", after=[run])
    w = _start(g)
    w = wait_for(lambda: (r := Workflow.objects.get(id=w.id)).is_final and r, 180, what="the workflow to end")
    assert w.state == "succeeded", w.error
    steps = {s.name: s for s in WorkflowStep.objects.filter(workflow=w)}
    assert steps["sleep"].result == {"tasks": 3, "sum": 3}
    assert SparkRun.objects.get(id=steps["sleep"].spark_run_id).trigger == "workflow"
    # wf.add sums its upstream integer results: a dict is not one, so it got exactly its own x
    assert steps["after"].result == 0


def test_cancel_during_a_running_spark_step_stops_the_run(workers):
    g = Graph("spark-cancel")
    run = g.spark("demo_sleep", {"tasks": 2, "seconds": 120}, name="long")
    g.task("wf.add", name="after", after=[run])
    w = _start(g)
    step = WorkflowStep.objects.get(workflow=w, name="long")
    running = wait_for(
        lambda: (
            (r := SparkRun.objects.get(id=step.spark_run_id)).state == "running"
            and r.progress.get("tasks_active")
            and r
        ),
        120,
        what="the Spark step's tasks to run",
    )
    assert services.cancel(w.id, actor="test")
    w = wait_for(lambda: (r := Workflow.objects.get(id=w.id)).is_final and r, 60, what="the workflow to end")
    assert w.state == "cancelled"
    run_row = SparkRun.objects.get(id=step.spark_run_id)
    assert run_row.state == "cancelled"
    assert group_members(running.driver_pgid) == []
    assert {s.name: s.state for s in WorkflowStep.objects.filter(workflow=w)} == {
        "long": "cancelled",
        "after": "cancelled",
    }


def test_demo_pipeline_runs_with_no_parameters(workers, manage):
    """The shipped demo: sample files fanned out per region -> events -> demo_rollup -> demo_analytics -> summary;
    its run records a materialization of each of the demo's datasets, the events' checks passed."""
    out = manage("workflow", "start", "demo_pipeline", "--wait", "--json", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    import json

    status = json.loads(out.stdout)
    states = {s["name"]: s["state"] for s in status["steps"]}
    named = ("plan", "events", "rollup", "analytics", "summary")
    assert {states.pop(name) for name in named} == {"succeeded"}
    assert len(states) == 5 and set(states.values()) == {"succeeded"}  # one sample_file per region
    summary = WorkflowStep.objects.get(workflow_id=status["id"], name="summary").result
    assert summary["rollup"]["input_rows"] == 5 * 2000
    assert summary["analytics"]["rows"] > 0 and summary["analytics"]["attempts"] > 0  # the demo's own steps
    rollup_run = WorkflowStep.objects.get(workflow_id=status["id"], name="rollup").spark_run_id
    made = {m.dataset: m for m in Materialization.objects.filter(dataset__startswith="demo.")}
    assert set(made) == {"demo.events", "demo.region_events", "demo.rollup", "demo.analytics"}
    # One partition of the day by region per sample file; a single day makes no week (demo.weekly_rollup waits).
    assert Materialization.objects.filter(dataset="demo.region_events").count() == 5
    assert made["demo.events"].files == 5 and made["demo.events"].checks == "passed"
    assert made["demo.rollup"].partition == made["demo.events"].partition
    assert made["demo.rollup"].spark_run_id == rollup_run and made["demo.rollup"].rows > 0
