"""The OpenTelemetry SDK's part of tracing (engine/tracing.py imports it only when tracing is set up): the
provider with its resource, the bounded batch export that counts what it drops, and what the sampler decides.

A library depends on the OpenTelemetry API only; the SDK and its exporter are the application's (the `tracing`
extra), so this is the one module of the app that imports them.
"""

import logging
import os
from collections.abc import Callable, Sequence

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler

logger = logging.getLogger("jobsite.tracing")


class CountingExporter(SpanExporter):
    """The OTLP exporter, counting the spans of every export that did not succeed (collector down, refused,
    timed out) as dropped."""

    def __init__(self, inner: SpanExporter, count_dropped: Callable[[int], None]) -> None:
        self.inner = inner
        self.count_dropped = count_dropped

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter must not take the export thread down
            logger.debug("span export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.count_dropped(len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor (bounded queue, export on its own thread), counting the spans it drops when
    its queue is full (the SDK drops the oldest one then, and only logs it)."""

    def __init__(self, exporter: SpanExporter, count_dropped: Callable[[int], None]) -> None:
        super().__init__(exporter)
        self.count_dropped = count_dropped
        # The SDK's bounded deque, found once (the same object in a forked child, which clears it): a span's end
        # looks at its length only.
        self._queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        self._full = None if self._queue is None else self._queue.maxlen

    def on_end(self, span: ReadableSpan) -> None:
        if self._full is not None and len(self._queue) >= self._full and span.context.trace_flags.sampled:
            self.count_dropped(1)
        super().on_end(span)


class HashedResource(Resource):
    """The SDK's Resource, hashed once: the OTLP encoder groups each exported span by its resource and hashes it
    every time (a JSON dump of its attributes: about 7 us a span on the export thread, a tenth of the encoding).
    A resource never changes, so neither does its hash."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def provider(
    exporter: SpanExporter, service_name: str, count_dropped: Callable[[int], None]
) -> tuple[TracerProvider, BatchSpanProcessor]:
    """A provider exporting through `exporter` in batches, its spans' drops counted by `count_dropped`. The
    sampler comes from OTEL_TRACES_SAMPLER (the SDK's default: parentbased_always_on)."""
    attributes = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attributes[SERVICE_NAME] = service_name
    built = TracerProvider(resource=HashedResource(Resource.create(attributes)))
    processor = CountingBatchSpanProcessor(CountingExporter(exporter, count_dropped), count_dropped)
    built.add_span_processor(processor)
    return built, processor


def drops_unsampled_parents(sampler: Sampler) -> bool:
    """Whether `sampler` drops every span whose remote parent was not sampled: a ParentBased one whose
    remote-parent-not-sampled delegate is AlwaysOff (the SDK's default for every ParentBased; read from its public
    description)."""
    return isinstance(sampler, ParentBased) and "remoteParentNotSampled:AlwaysOffSampler," in (
        sampler.get_description()
    )
