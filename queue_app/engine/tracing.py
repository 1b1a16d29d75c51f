"""OpenTelemetry traces (issue 40): one home for the tracer, set up once per process, and the few helpers the
engine and the worker call. The layers' own spans are their apps' (a workflow's start: workflows/spans.py; a Spark
run and its jobs and stages: spark/spans.py), on this module's tracer.

Off by default. On when the SDK's standard environment says so: `OTEL_TRACES_EXPORTER=otlp` (and
`OTEL_SDK_DISABLED` not true); the rest is the SDK's own variables, read by the SDK (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `_ARG`, `OTEL_EXPORTER_OTLP_ENDPOINT` / `_TRACES_ENDPOINT`,
`_HEADERS`, `_TIMEOUT`, `OTEL_BSP_*`). Spans go out over OTLP/HTTP (protobuf) from a BatchSpanProcessor: a bounded
queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048) emptied by its own thread, so a collector that is down or slow never blocks
the caller; what the queue cannot hold and what an export fails to deliver is counted (`dropped()`: the worker's
row stats and /metrics, `jobsite_worker_spans_dropped_total` and `jobsite_spans_dropped_total`).

With tracing off every call site pays one module attribute read (`tracing.enabled`): no span, no context, no
column value (the items' `trace_context` stays NULL).

Sampling (issue 40's 1 % goal): a producer span the sampler dropped still stores its context, with the sampled flag
0 (`...-02` as the SDK writes it, its random-trace-id bit set). Storing nothing instead would not be the same:
the consumer's span would then be a root, which the
root sampler decides on afresh (at `parentbased_traceidratio` 0.01, one attempt in 100 of unsampled items would
start a trace of its own, without its enqueue); the stored flag makes every consumer follow the producer's
decision. With a ParentBased sampler whose remote-parent-not-sampled delegate is AlwaysOff (every `parentbased_*`
the SDK's OTEL_TRACES_SAMPLER names), an attempt whose item's context says "not sampled" is known to be dropped
without asking the SDK (`start_attempt`: one character looked at, no span object, no attribute dict, nothing to
end or settle); its handler gets the item's context as it is (`Job.trace_parent`), not attached to OpenTelemetry's
context (that costs more than a no-op item's whole share of a 3 % budget) but kept in a context variable
(`carried`) that jobsite's own producer spans read when there is no current span, so what a not-sampled item
enqueues is not sampled either.

The W3C trace context travels as a `traceparent` string (`00-<trace id>-<span id>-<flags>`): stored with an item
(its `trace_context` column, the workflow's row), handed to a pool's child in the worker's Job and to a Spark
driver as `TRACEPARENT`.
"""

import atexit
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

logger = logging.getLogger("jobsite.tracing")

# The flag every hot-path call site reads first. Set once, by configure().
enabled = False
tracer: trace.Tracer = trace.NoOpTracer()
# The SDK's provider and span processor (tracing_sdk.py), once configure() set tracing up: the SDK is imported
# only then, so a process without tracing (and a project without the tracing extra) never loads it.
_provider: Any = None
_processor: Any = None
_lock = threading.Lock()
_dropped = 0  # spans this process lost: the queue was full, or their export failed
# Whether the sampler drops every span whose remote parent was not sampled (set by configure()): then a stored
# context with the sampled flag 0 decides an attempt without the SDK.
_drops_unsampled_parents = False
# A not-sampled item's context, carried under its handler without being attached (run_job sets it; producer()
# reads it): the handler's enqueues stay in the item's trace, not sampled.
carried: ContextVar[str | None] = ContextVar("jobsite_trace_carried", default=None)
_NOT_SAMPLED_LAST = frozenset("02468ace")  # the last hex digit of a traceparent's flags when the sampled bit is 0


def wanted() -> bool:
    """Whether the environment turns tracing on: OTEL_TRACES_EXPORTER names otlp (the SDK's own default is otlp;
    jobsite's is off, so the variable must be set)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = {name.strip().lower() for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    return "otlp" in names


def dropped() -> int:
    """Spans this process dropped so far (queue full or export failed)."""
    return _dropped


def _count_dropped(n: int) -> None:
    global _dropped
    with _lock:
        _dropped += n


def configure(exporter: Any = None, *, service_name: str = "jobsite") -> bool:
    """Set tracing up for this process, once (later calls change nothing), when the environment asks for it or
    an `exporter` is given (the tests'). Also instruments Django (opentelemetry-instrumentation-django), so a
    request that enqueues is the parent of the enqueue's span. Returns whether tracing is on."""
    global enabled, tracer, _provider, _processor, _drops_unsampled_parents
    with _lock:
        if _provider is not None:
            return enabled
        if exporter is None and not wanted():
            return False
        try:
            from . import tracing_sdk

            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter()
        except ImportError as exc:  # the environment asks for traces the installed extras cannot make
            logger.error("tracing is off: %s (install jobsite[tracing])", exc)
            return False
        _provider, _processor = tracing_sdk.provider(exporter, service_name, _count_dropped)
        _drops_unsampled_parents = tracing_sdk.drops_unsampled_parents(_provider.sampler)
        trace.set_tracer_provider(_provider)  # global: Django's instrumentation and the handlers' own spans
        tracer = _provider.get_tracer("jobsite")
        enabled = True
    _instrument_django()
    atexit.register(shutdown)
    return True


def _instrument_django() -> None:
    try:
        from opentelemetry.instrumentation.django import DjangoInstrumentor
    except ImportError:  # the instrumentation is optional: without it, enqueue spans have no request parent
        return
    instrumentor = DjangoInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=_provider)


def flush(timeout_millis: int = 5_000) -> bool:
    """Export what is queued now (tests, the end of a CLI command)."""
    return _provider.force_flush(timeout_millis) if _provider is not None else True


def shutdown() -> None:
    """Flush and stop the export thread (at exit). Bounded by the exporter's timeout: a dead collector delays the
    exit by at most that, and loses the spans (counted)."""
    if _provider is not None:
        _provider.shutdown()


def drops_unsampled_parents(sampler: Any) -> bool:
    """Whether `sampler` drops every span whose remote parent was not sampled (tracing_sdk.py says how)."""
    from .tracing_sdk import drops_unsampled_parents as drops

    return drops(sampler)


# -- trace context ----------------------------------------------------------------------------------------------


def sampled(value: str) -> bool:
    """Whether a stored traceparent says its trace is sampled (its flags' lowest bit)."""
    return value[-1] not in _NOT_SAMPLED_LAST


def traceparent(span: trace.Span | None = None) -> str | None:
    """The W3C traceparent of `span` (default: the current one), or None when there is none valid."""
    ctx = (span or trace.get_current_span()).get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def current_ids() -> dict[str, str]:
    """The current span's trace and span ids (hex), for log lines; empty when there is none."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


def context_of(value: str | None) -> otel_context.Context | None:
    """An OpenTelemetry context whose parent is the span a stored traceparent names (None: no parent, a new
    trace)."""
    if not value:
        return None
    parts = value.split("-")
    try:
        if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
            return None
        span_context = SpanContext(
            int(parts[1], 16), int(parts[2], 16), is_remote=True, trace_flags=TraceFlags(int(parts[3], 16) & 1)
        )
    except ValueError:
        return None
    if not span_context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def attach(value: str) -> object | None:
    """Make the stored context `value` the current one (a pool child about to run a sampled attempt's handler);
    the token for detach(). A plain call pair rather than a context manager: run once an item in the children
    (about 3 us less an item)."""
    ctx = context_of(value)
    return None if ctx is None else otel_context.attach(ctx)


def detach(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)


# -- the spans jobsite makes -----------------------------------------------------------------------------------


@contextmanager
def producer(task: str, queue: str, count: int = 1) -> Iterator[trace.Span]:
    """The span of one enqueue (or one bulk enqueue of `count` items), a child of the current span (a request's,
    a handler's; else the not-sampled item a handler runs for, `carried`): its traceparent is what the item
    stores, sampled or not (a bulk's items store their own: bulk_items). Its attributes are set once the sampler
    kept it (so the sampler decides without them, as the SDK's own samplers do anyway): a dropped producer span
    builds none."""
    context = None
    if (value := carried.get()) is not None and not trace.get_current_span().get_span_context().is_valid:
        context = context_of(value)
    with tracer.start_as_current_span(f"enqueue {task}", context=context, kind=SpanKind.PRODUCER) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": "jobsite",
                    "messaging.operation.type": "send",
                    "messaging.destination.name": queue,
                    "jobsite.task": task,
                    "messaging.batch.message_count": count,
                }
            )
        yield span


def bulk_items(bulk: trace.Span, task: str, queue: str, ids: Sequence[int]) -> list[str]:
    """The contexts the items of a bulk enqueue store: each item starts a trace of its own (a bulk of thousands
    is not one trace of thousands of attempts), with a short "create" span, a root the sampler decides on alone,
    linked to the bulk's span; the bulk's span links to each item whose trace is sampled (up to the SDK's link
    limit, OTEL_SPAN_LINK_COUNT_LIMIT, 128 by default). An unsampled item stores its unsampled context: its
    attempts are not sampled either (the SDK's default parent-based sampler)."""
    to_bulk = [trace.Link(bulk.get_span_context())]
    root = otel_context.Context()  # no parent: a new trace
    attributes = {
        "messaging.system": "jobsite",
        "messaging.operation.type": "create",
        "messaging.destination.name": queue,
        "jobsite.task": task,
    }
    contexts = []
    for item_id in ids:
        span = tracer.start_span(f"create {task}", context=root, kind=SpanKind.PRODUCER, links=to_bulk)
        ctx = span.get_span_context()
        if span.is_recording():
            span.set_attributes(attributes)
            span.set_attribute("jobsite.item_id", item_id)
            span.end()
            bulk.add_link(ctx)
        contexts.append(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}")
    return contexts


def start_attempt(lease: Any, parent: str | None, worker_id: str) -> trace.Span | None:
    """The consumer span of one attempt, a child of its item's stored context (retries are siblings under the
    enqueue), ended by end_attempt when the worker knows the outcome; None when the sampler dropped it. The
    attributes are set only on a span that records: a dropped one costs the sampler's decision and no more, and
    one whose stored context says "not sampled" under a ParentBased sampler not even that (module docstring)."""
    if parent is not None and _drops_unsampled_parents and parent[-1] in _NOT_SAMPLED_LAST:
        return None
    span = tracer.start_span(f"process {lease.task}", context=context_of(parent), kind=SpanKind.CONSUMER)
    if not span.is_recording():
        return None
    # As few attributes as say what is needed: each one costs the SDK's validation and the exporter's encoding,
    # per item (queue_bench's tracing part). The retry number is attempt - 1; the system is the span's scope.
    attributes: dict[str, Any] = {
        "jobsite.task": lease.task,
        "messaging.destination.name": lease.queue,
        "jobsite.item_id": lease.item_id,
        "jobsite.attempt": lease.attempt,
        "jobsite.worker_id": worker_id,
    }
    if lease.workflow_id is not None:  # a workflow step's item (the traced lease says which)
        attributes["jobsite.workflow_id"] = lease.workflow_id
        attributes["jobsite.workflow_step"] = lease.step
    if lease.attempt == 1:  # from the item's due time to this start: the wait for a worker
        attributes["jobsite.lease_wait_s"] = max(0.0, (datetime.now(UTC) - lease.run_at).total_seconds())
    span.set_attributes(attributes)
    return span


def end_attempt(span: trace.Span, outcome: str, *, error: str = "", event: str | None = None, **fields: Any) -> None:
    """End an attempt's span with its outcome ("done", "failed", "stale", "timed_out", "released"); `event` (a
    "retry", a "dead_letter") is recorded on it first, with `fields` as its attributes."""
    span.set_attribute("jobsite.outcome", outcome)
    if event is not None:
        span.add_event(event, {k: v for k, v in fields.items() if v is not None})
    if error:
        span.set_status(trace.StatusCode.ERROR, error[:500])
    span.end()


def event_span(name: str, value: str | None, event: str, **attributes: Any) -> None:
    """A short span, child of a stored context, carrying one event: what happens to an item outside its
    attempts (a requeue, a poison dead letter)."""
    span = tracer.start_span(name, context=context_of(value), attributes=attributes)
    span.add_event(event, attributes)
    span.end()


def scalars(prefix: str, values: Any) -> dict[str, Any]:
    """`values` (a mapping) as span attributes `prefix.key`: its numbers, strings and booleans only."""
    if not isinstance(values, dict):
        return {}
    return {f"{prefix}.{k}": v for k, v in values.items() if isinstance(v, int | float | str | bool)}
