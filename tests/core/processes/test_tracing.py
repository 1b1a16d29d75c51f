"""OpenTelemetry traces (issue 40, queue_app/engine/tracing.py), received by a real OTLP/HTTP receiver on loopback
(jobsite/bench/otlp_receiver.py: the protobuf decoded with opentelemetry-proto):

- an item enqueued inside a Django request, failed once then done by a real worker process, is one trace: the
  request's server span -> the enqueue's producer span -> one consumer span per attempt (siblings), with their
  attributes and the retry event; the item (and its archived row) stores the enqueue's context;
- a workflow is one trace: its start span parents every step's attempt, a step enqueued by the settle trigger too;
- the receiver stopped mid-run: every item still settles, the worker counts the spans it dropped (/metrics);
- with tracing off nothing is stored and no span is made;
- a producer span the sampler dropped still stores its context, not sampled (so the consumers follow its decision),
  and under a not-sampled item's handler (its context carried, not attached) the enqueue joins that trace.

This process's own spans (the request, the enqueue, the workflow start) go through the same module, configured with
an exporter to the receiver; the workers are configured by the SDK's standard environment variables.
"""

import json
import logging

import pytest
from django.db import connection, transaction
from django.http import JsonResponse
from django.test import Client
from django.urls import path
from django.utils import timezone

from jobsite.bench.otlp_receiver import Receiver
from queue_app import engine, services
from queue_app.engine import tracing
from queue_app.logcontext import ContextFilter, current
from queue_app.models import Queue, QueueItem, Worker
from queue_app.worker.execute import Job, run_job
from queue_app.workflows import services as workflows
from queue_app.workflows.definition import Graph
from tests.support.tracing_fixtures import otel_env, receiver_fixture, traced_fixture  # noqa: F401  fixtures
from tests.support.waiting import wait_for
from tests.tasks import json_log_tasks, workflow_tasks  # noqa: F401  registers tests.logs_then_fails_once, wf.fan, wf.add

pytestmark = pytest.mark.django_db


def enqueue_view(request):
    item = engine.enqueue("tests.logs_then_fails_once", {"n": 1}, queue="otel")
    return JsonResponse({"id": item.id})


urlpatterns = [path("enqueue", enqueue_view)]


def of_trace(receiver: Receiver, trace_id: str, consumers: int) -> list | None:
    """The trace's spans once `consumers` attempts' spans of it have arrived."""
    spans = [s for s in receiver.spans() if s.trace_id == trace_id]
    return spans if sum(s.kind == "consumer" for s in spans) >= consumers else None


def test_tracing_off_writes_no_context_and_makes_no_span():
    assert not tracing.enabled  # the environment of the test run does not ask for it
    one = engine.enqueue("queue_app.noop", queue="otel_off")
    many = engine.enqueue_many("queue_app.noop", [{}, {}], queue="otel_off")
    stored = QueueItem.objects.filter(id__in=[one.id, *many]).values_list("trace_context", flat=True)
    assert list(stored) == [None, None, None]
    assert tracing.traceparent() is None and "trace_id" not in current()


def test_bulk_enqueue_is_one_span_with_the_count_linked_to_the_items_own_traces(traced):
    ids = engine.enqueue_many("queue_app.noop", [{}, {}, {}], queue="otel_bulk")
    stored = dict(QueueItem.objects.filter(id__in=ids).values_list("id", "trace_context"))
    items = {item_id: value.split("-")[1:3] for item_id, value in stored.items()}  # [trace id, span id]
    assert len({trace_id for trace_id, _ in items.values()}) == 3  # a trace of its own each
    tracing.flush()
    (bulk,) = wait_for(
        lambda: [s for s in traced.spans() if s.name == "enqueue queue_app.noop" and len(s.links) == 3],
        10,
        what="the bulk span",
    )
    assert bulk.kind == "producer" and bulk.trace_id not in {trace_id for trace_id, _ in items.values()}
    assert bulk.attributes["messaging.batch.message_count"] == 3
    assert bulk.attributes["messaging.destination.name"] == "otel_bulk"
    assert sorted(bulk.links) == sorted(tuple(v) for v in items.values())  # linked to each item's trace
    created = {s.span_id: s for s in traced.spans() if s.name == "create queue_app.noop"}
    for item_id, (trace_id, span_id) in items.items():  # each item's trace: its create span, a root
        span = created[span_id]
        assert span.trace_id == trace_id and span.parent_id == "" and span.kind == "producer"
        assert span.attributes["jobsite.item_id"] == item_id and span.links == [(bulk.trace_id, bulk.span_id)]


def test_a_bulk_enqueue_links_only_the_items_whose_trace_is_sampled(traced, monkeypatch):
    """At 50 % sampling about half the items' traces are sampled (each item's a root the sampler decides on): the
    bulk's span (in its sampled caller's trace) links those, and each item stores its own context (an unsampled
    one says so: its attempts are not sampled either)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    half = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.5)), resource=tracing._provider.resource)
    half.add_span_processor(tracing._processor)
    monkeypatch.setattr(tracing, "tracer", half.get_tracer("jobsite"))
    with tracing._provider.get_tracer("tests").start_as_current_span("request"):  # sampled: so is the bulk's span
        ids = engine.enqueue_many("queue_app.noop", [{}] * 40, queue="otel_bulk_half")
    stored = [v.split("-") for v in QueueItem.objects.filter(id__in=ids).values_list("trace_context", flat=True)]
    sampled = {(trace_id, span_id) for _, trace_id, span_id, flags in stored if int(flags, 16) & 1}
    assert len(stored) == 40 and 0 < len(sampled) < 40  # 2 ** -39 odds of all or none
    # a not-sampled item stores flags 02, as docs/how-to/tracing.md says the SDK writes them (random trace id set)
    assert {flags for *_, flags in stored if not int(flags, 16) & 1} == {"02"}, stored
    tracing.flush()
    (bulk,) = wait_for(
        lambda: [
            s
            for s in traced.spans()
            if s.attributes.get("messaging.destination.name") == "otel_bulk_half" and s.name == "enqueue queue_app.noop"
        ],
        10,
        what="the bulk span",
    )
    assert set(bulk.links) == sampled


def test_a_requeue_is_an_event_under_the_items_enqueue(traced):
    item = engine.enqueue("queue_app.noop", queue="otel_requeue")
    _, trace_id, enqueue_span_id, _ = QueueItem.objects.get(id=item.id).trace_context.split("-")
    assert services.cancel_items([item.id]) == 1
    assert services.requeue_items([item.id], actor="ops") == 1
    tracing.flush()
    (span,) = wait_for(
        lambda: [s for s in traced.spans() if s.name == "requeue queue_app.noop" and s.trace_id == trace_id],
        10,
        what="the requeue's span",
    )
    assert span.parent_id == enqueue_span_id and span.attributes["jobsite.item_id"] == item.id
    assert [(name, attrs["jobsite.actor"]) for name, attrs in span.events] == [("requeue", "ops")]


NOT_SAMPLED_CONTEXT = "00-" + "c3" * 16 + "-" + "d4" * 8 + "-00"


def test_a_dropped_producer_span_stores_its_context_not_sampled(traced):
    token = tracing.attach(NOT_SAMPLED_CONTEXT)  # a not-sampled parent: the ParentBased sampler drops the span
    try:
        attached = engine.enqueue("queue_app.noop", queue="otel_sampling_producer").id
    finally:
        tracing.detach(token)
    token = tracing.carried.set(NOT_SAMPLED_CONTEXT)  # as run_job carries a not-sampled item's context for its handler
    try:
        carried = engine.enqueue("queue_app.noop", queue="otel_sampling_producer").id
    finally:
        tracing.carried.reset(token)
    stored = dict(QueueItem.objects.filter(id__in=[attached, carried]).values_list("id", "trace_context"))
    for item_id in (attached, carried):
        version, trace_id, span_id, _ = stored[item_id].split("-")
        assert (version, trace_id) == ("00", NOT_SAMPLED_CONTEXT.split("-")[1]) and not tracing.sampled(stored[item_id])
        assert span_id != NOT_SAMPLED_CONTEXT.split("-")[2]  # the dropped producer span's own id
    root = engine.enqueue("queue_app.noop", queue="otel_sampling_producer").id  # no parent: a root, sampled
    assert tracing.sampled(QueueItem.objects.get(id=root).trace_context)  # flags 01, or 03 (random trace id)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_request_that_enqueues_then_two_attempts_in_a_worker_are_one_trace(traced, worker, settings):
    settings.ROOT_URLCONF = __name__
    response = Client().get("/enqueue")
    assert response.status_code == 200
    item_id = json.loads(response.content)["id"]
    stored = QueueItem.objects.get(id=item_id).trace_context
    _, trace_id, enqueue_span_id, _ = stored.split("-")

    proc = worker(
        "otel-worker",
        "--import",
        "tests.tasks.json_log_tasks",
        "--queues",
        "otel",
        "--burst",
        env=otel_env(traced, LOG_FORMAT="json", LOG_LEVEL="INFO"),
    )
    assert proc.wait(timeout=120) == 0, proc.log.read_text()[-3000:]
    tracing.flush()
    spans = wait_for(
        lambda: of_trace(traced, trace_id, 2),
        20,
        what="the request's, the enqueue's and both attempts' spans",
    )
    by_kind = {kind: [s for s in spans if s.kind == kind] for kind in ("server", "producer", "consumer")}
    (server,) = by_kind["server"]
    (producer,) = by_kind["producer"]
    assert producer.span_id == enqueue_span_id and producer.parent_id == server.span_id
    assert producer.name == "enqueue tests.logs_then_fails_once" and producer.attributes["jobsite.item_id"] == item_id
    first, second = sorted(by_kind["consumer"], key=lambda s: s.attributes["jobsite.attempt"])
    for span, attempt in ((first, 1), (second, 2)):  # retries are siblings under the enqueue
        assert span.parent_id == producer.span_id and span.service == "jobsite-worker"
        assert span.attributes["jobsite.item_id"] == item_id
        assert span.attributes["jobsite.attempt"] == attempt
        assert span.attributes["jobsite.task"] == "tests.logs_then_fails_once"
        assert span.attributes["messaging.destination.name"] == "otel"
        assert span.attributes["jobsite.worker_id"] == "otel-worker"
    assert first.attributes["jobsite.outcome"] == "failed" and first.status_code == 2  # STATUS_CODE_ERROR
    assert [name for name, _ in first.events] == ["retry"] and first.events[0][1]["next_attempt"] == 2
    assert "jobsite.lease_wait_s" in first.attributes
    assert second.attributes["jobsite.outcome"] == "done" and second.events == []

    # The handler's log lines carry the attempt's trace and span ids (logcontext.py).
    records = [json.loads(line) for line in proc.log.read_text().splitlines()]
    handled = [r for r in records if r["message"].startswith("handling")]
    assert {(r["trace_id"], r["span_id"]) for r in handled} == {(trace_id, first.span_id), (trace_id, second.span_id)}

    # The archived row keeps the context (the history tables and queue_app_item_all carry the column).
    with transaction.atomic():
        assert engine.archive(grace=0) >= 1
    with connection.cursor() as cur:
        cur.execute("SELECT trace_context FROM queue_app_item_all WHERE id = %s", [item_id])
        assert cur.fetchone() == (stored,)
        cur.execute("SELECT trace_context FROM queue_app_itemhistory WHERE id = %s", [item_id])
        assert cur.fetchone() == (stored,)


def test_the_traced_lease_returns_the_items_context_and_a_steps_workflow_for_its_log_lines(traced):
    plain = engine.enqueue("queue_app.noop", queue="otel_lease").id
    limited = engine.enqueue("queue_app.noop", queue="otel_lease_limited").id  # leased by sql.LEASE_TRACED
    fair = engine.enqueue("queue_app.noop", queue="otel_lease_fair", group_key="a").id  # LEASE_FAIR_TRACED
    aged = engine.enqueue("queue_app.noop", queue="otel_lease_aged").id  # LEASE_AGED_TRACED
    Queue.objects.filter(name="otel_lease_limited").update(concurrency_limit=5)
    Queue.objects.filter(name="otel_lease_fair").update(fair=True)
    Queue.objects.filter(name="otel_lease_aged").update(aging_rate=1.0)
    untraced = engine.enqueue("queue_app.noop", queue="otel_lease_plain").id
    graph = Graph("otel-lease")
    graph.task("tests.logs_then_fails_once", {"n": 7}, name="only")
    workflow = workflows.start_graph(graph)
    workflow.refresh_from_db()
    step_item = QueueItem.objects.get(workflow_step_id__isnull=False, queue_id="json_logs")
    stored = dict(QueueItem.objects.values_list("id", "trace_context"))

    # tracing off's statements return none of it (the worker's lease with tracing off)
    (lease,) = engine.lease(["otel_lease_plain"], 5, "otel-w", 60)
    assert lease.item_id == untraced and (lease.trace_context, lease.workflow_id, lease.step) == (None, None, None)

    queues = ["otel_lease", "otel_lease_limited", "otel_lease_fair", "otel_lease_aged", "json_logs"]
    leases = engine.lease(queues, 9, "otel-w", 60, traced=True)
    got = {lease.item_id: (lease.trace_context, lease.workflow_id, lease.step) for lease in leases}
    assert got == {
        plain: (stored[plain], None, None),
        limited: (stored[limited], None, None),
        fair: (stored[fair], None, None),
        aged: (stored[aged], None, None),
        step_item.id: (workflow.trace_context, workflow.id, "only"),
    }
    assert stored[plain] and workflow.trace_context  # contexts stored, and returned as stored

    # The step's handler, run as the worker runs it: its lines carry the workflow's id and the step's name.
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    keep.addFilter(ContextFilter())
    handler_logger = logging.getLogger("tests.json_logs")
    handler_logger.addHandler(keep)
    try:
        [step] = [lease for lease in leases if lease.item_id == step_item.id]
        job = Job(step.reservation_id, step.item_id, step.queue, step.task, step.payload, 2, 3, "otel-w")
        assert run_job(job._replace(workflow_id=step.workflow_id, step=step.step)).status == "ok"
        assert run_job(job).status == "ok"  # not a step (or tracing off): no workflow ids
    finally:
        handler_logger.removeHandler(keep)
    ids = [(r.item_id, getattr(r, "workflow_id", None), getattr(r, "workflow_step", None)) for r in seen]
    assert ids == [(step_item.id, workflow.id, "only")] * 2 + [(step_item.id, None, None)] * 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_workflow_is_one_trace_under_its_start_span(traced, worker):
    graph = Graph("otel-flow")
    first = graph.task("wf.fan", {"n": 2}, name="first")
    graph.task("queue_app.echo", {"x": 1}, name="second", after=[first])
    workflow = workflows.start_graph(graph)
    workflow.refresh_from_db()
    _, trace_id, start_span_id, _ = workflow.trace_context.split("-")

    proc = worker("otel-flow-worker", "--import", "tests.tasks.workflow_tasks", "--burst", env=otel_env(traced))
    assert proc.wait(timeout=120) == 0, proc.log.read_text()[-3000:]
    workflow.refresh_from_db()
    assert workflow.state == "succeeded"
    tracing.flush()
    spans = wait_for(lambda: of_trace(traced, trace_id, 5), 20, what="the start span and the steps' attempts")
    (start,) = [s for s in spans if s.span_id == start_span_id]
    assert start.name == "workflow otel-flow" and start.attributes["jobsite.workflow_id"] == workflow.id
    attempts = [s for s in spans if s.kind == "consumer"]
    by_task = {}
    for span in attempts:
        by_task.setdefault(span.attributes["jobsite.task"], []).append(span)
    assert sorted((t, len(s)) for t, s in by_task.items()) == [
        ("queue_app.echo", 1),
        ("queue_app.workflow_finished", 1),
        ("wf.add", 2),
        ("wf.fan", 1),
    ]
    (fan,) = by_task["wf.fan"]
    # The steps the start enqueued, the one the settle trigger enqueued in the worker and the finished callback
    # are children of the start span; the fan-out's steps are children of the attempt that made them.
    assert {s.parent_id for t in ("wf.fan", "queue_app.echo", "queue_app.workflow_finished") for s in by_task[t]} == {
        start_span_id
    }
    assert {s.parent_id for s in by_task["wf.add"]} == {fan.span_id}
    # each step's attempt names its workflow and step (the traced lease returns them); the callback is no step
    steps = {(s.attributes.get("jobsite.workflow_id"), s.attributes.get("jobsite.workflow_step")) for s in attempts}
    assert {(workflow.id, "first"), (workflow.id, "second")} <= steps
    assert (None, None) in steps and {wf_id for wf_id, _ in steps} == {workflow.id, None}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_collector_stopped_mid_run_loses_no_item_and_the_drops_are_counted(worker):
    collector = Receiver()
    ids = engine.enqueue_many("queue_app.sleep", [{"seconds": 0.01}] * 300, queue="otel_drop")
    proc = worker(
        "otel-drop",
        "--queues",
        "otel_drop",
        "--concurrency",
        "4",
        "--burst",
        # A small export queue (the default holds 2,048 spans), and a short export timeout so the exit's last
        # flush to the dead collector gives up quickly.
        env=otel_env(
            collector, OTEL_BSP_MAX_QUEUE_SIZE="16", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="8", OTEL_EXPORTER_OTLP_TIMEOUT="1"
        ),
    )
    wait_for(lambda: collector.count() > 0, 60, what="the first spans at the collector")
    collector.stop()  # the collector is gone: the worker goes on
    assert proc.wait(timeout=180) == 0, proc.log.read_text()[-3000:]
    states = set(QueueItem.objects.filter(id__in=ids).values_list("state", flat=True))
    assert states == {"done"}
    stats = Worker.objects.get(id="otel-drop").stats
    assert stats["processed"] == 300 and stats["spans_dropped"] > 0
    assert collector.count() + stats["spans_dropped"] <= 300


def test_the_metrics_show_the_workers_dropped_spans():
    now = timezone.now()
    Worker.objects.create(
        id="otel-metrics", host="h", pid=1, started_at=now, last_heartbeat=now, stats={"spans_dropped": 7}
    )
    body = Client().get("/metrics").content.decode()
    assert 'jobsite_worker_spans_dropped_total{worker="otel-metrics"} 7.0' in body
