"""A workflow with a task step and a Spark step, run by a real worker with tracing on, is one trace down to the
Spark run's stages (issue 40; the one JVM test of tracing): the start span -> each step's attempt -> the run's span
(its metrics as attributes) -> a span per Spark job -> a span per stage, read from the run's event log. The Spark
step is an existing PySpark script that traces itself with OpenTelemetry (tests/tasks/spark_scripts/traced_count.py):
its own span continues the trace from TRACEPARENT, under the run's span."""

import json

import pytest

from queue_app.spark import eventlog
from queue_app.spark.models import SparkRun
from queue_app.spark.scripts import ROOTS_ENV
from queue_app.workflows import services as workflows
from queue_app.workflows.definition import Graph
from tests.support.paths import SPARK_SCRIPTS
from tests.support.spark_fixtures import require_spark
from tests.support.spark_jvm import FAST_JVM_FLAGS
from tests.support.tracing_fixtures import otel_env, receiver_fixture, traced_fixture  # noqa: F401  fixtures
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SCRIPTS = SPARK_SCRIPTS


def test_a_workflow_with_a_spark_step_is_one_trace_down_to_its_stages(traced, worker, monkeypatch):
    require_spark()
    monkeypatch.setenv(ROOTS_ENV, str(SCRIPTS))  # here (the step's parameters are checked) and in the worker
    graph = Graph("otel-spark-flow")
    first = graph.task("queue_app.noop", {}, name="prepare")
    script = {"path": str(SCRIPTS / "traced_count.py"), "args": json.dumps(["2"])}
    graph.spark("script", script, name="crunch", after=[first])
    workflow = workflows.start_graph(graph)
    workflow.refresh_from_db()
    _, trace_id, start_span_id, _ = workflow.trace_context.split("-")
    env = otel_env(
        traced,
        SPARK_MASTER="local[2]",
        JAVA_TOOL_OPTIONS=FAST_JVM_FLAGS,
    )
    proc = worker("otel-spark", "--burst", env=env)
    assert proc.wait(timeout=240) == 0, proc.log.read_text()[-3000:]
    workflow.refresh_from_db()
    assert workflow.state == "succeeded", workflow.error
    try:
        trace = wait_for(
            lambda: (
                (spans := [s for s in traced.spans() if s.trace_id == trace_id])
                and any(s.name.startswith("spark stage") for s in spans)
                and any(s.name == "count rows" for s in spans)
                and spans
            ),
            30,
            what="the run's stage spans and the script's own span in the workflow's trace",
        )
    except AssertionError as exc:  # what did arrive, the runs and their event logs, the worker's log
        raise AssertionError(f"{exc}\n{_what_arrived(traced, trace_id, proc)}") from None
    by_id = {s.span_id: s for s in trace}
    attempts = {s.attributes["jobsite.task"]: s for s in trace if s.kind == "consumer"}
    assert attempts["queue_app.noop"].parent_id == start_span_id
    assert attempts["queue_app.spark_run"].parent_id == start_span_id
    (run_span,) = [s for s in trace if s.name == "spark run script"]
    assert run_span.parent_id == attempts["queue_app.spark_run"].span_id
    assert run_span.attributes["jobsite.spark.outcome"] == "succeeded"
    assert run_span.attributes["jobsite.spark.metrics.tasks"] == 2
    assert run_span.attributes["jobsite.spark.progress.tasks_done"] == 2
    jobs = [s for s in trace if s.name.startswith("spark job")]
    stages = [s for s in trace if s.name.startswith("spark stage")]
    assert jobs and stages
    assert {s.parent_id for s in jobs} == {run_span.span_id}
    assert {by_id[s.parent_id].name for s in stages} <= {s.name for s in jobs}
    # The script's own span: a child of the run's span (TRACEPARENT in its driver's environment).
    (own,) = [s for s in trace if s.name == "count rows"]
    assert own.parent_id == run_span.span_id and own.attributes["rows"] == 1000


def _what_arrived(receiver, trace_id: str, proc) -> str:
    runs = [
        (r.id, r.state, r.app_id, (r.progress or {}).get("path"), eventlog.files(r.id)) for r in SparkRun.objects.all()
    ]
    spans = [(s.name, s.service, s.span_id, s.parent_id) for s in receiver.spans() if s.trace_id == trace_id]
    others = [(s.name, s.trace_id) for s in receiver.spans() if s.trace_id != trace_id]
    tail = proc.log.read_text()[-4000:]
    return f"the trace's spans: {spans}\nother spans: {others[:20]}\nruns: {runs}\nthe worker said:\n{tail}"
