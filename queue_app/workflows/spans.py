"""A workflow's trace span (issue 40), on the core's tracer (queue_app/engine/tracing.py): its start, the parent of
every step's item. Called only when `tracing.enabled` (workflows/services.py checks the flag).
"""

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from ..engine import tracing


@contextmanager
def workflow_start(name: str, kind: str) -> Iterator[trace.Span]:
    """The span of a workflow's start: the parent of every step's item (a workflow is one trace)."""
    with tracing.tracer.start_as_current_span(
        f"workflow {name}", kind=SpanKind.PRODUCER, attributes={"jobsite.workflow": name, "jobsite.workflow.kind": kind}
    ) as span:
        yield span
