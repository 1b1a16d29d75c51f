"""Sampling (issue 40, queue_app/engine/tracing.py): an item's stored context decides its attempts.

- Under a ParentBased sampler (every `parentbased_*` of OTEL_TRACES_SAMPLER) an item stored as not sampled (flags
  00) makes no span in the worker, and what its handler enqueues stores a context of the same trace, not sampled
  either; a sampled item's attempt is recorded, and its handler's enqueue is its child, sampled.
- (tests/core/processes/test_tracing.py, where this process's tracing is set up: a producer span the sampler dropped
  still stores its context, not sampled.)
- Which samplers let the worker decide from the stored flag alone.
"""

import pytest
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    DEFAULT_ON,
    ParentBased,
    ParentBasedTraceIdRatio,
    TraceIdRatioBased,
)

from queue_app import engine
from queue_app.engine import tracing
from queue_app.models import QueueItem
from tests.support.tracing_fixtures import otel_env, receiver_fixture  # noqa: F401  fixtures
from tests.support.waiting import wait_for
from tests.tasks import tracing_sampling_tasks  # noqa: F401  registers tests.enqueues_next

pytestmark = pytest.mark.django_db

# This file never turns tracing on in its own process: the provider is set up once a process, towards the receiver
# of the module that does (tests/core/processes/test_tracing.py's `traced`).
SAMPLED = "00-" + "a1" * 16 + "-" + "b2" * 8 + "-01"
NOT_SAMPLED = "00-" + "c3" * 16 + "-" + "d4" * 8 + "-00"


def test_the_samplers_whose_not_sampled_parents_decide_without_the_sdk():
    assert tracing.drops_unsampled_parents(DEFAULT_ON)  # parentbased_always_on, the SDK's default
    assert tracing.drops_unsampled_parents(ParentBasedTraceIdRatio(0.01))  # parentbased_traceidratio
    assert not tracing.drops_unsampled_parents(ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON))
    assert not tracing.drops_unsampled_parents(TraceIdRatioBased(0.01))  # the parent's flag is not what decides
    assert not tracing.drops_unsampled_parents(ALWAYS_ON)
    assert tracing.sampled(SAMPLED) and not tracing.sampled(NOT_SAMPLED)
    assert tracing.sampled("00-" + "a1" * 16 + "-" + "b2" * 8 + "-03")  # other flag bits set: still sampled
    assert not tracing.sampled("00-" + "a1" * 16 + "-" + "b2" * 8 + "-02")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_not_sampled_item_makes_no_span_and_its_handlers_enqueue_stays_not_sampled(receiver, worker):
    sampled, not_sampled = engine.enqueue_many("tests.enqueues_next", [{}, {}], queue="otel_sampling")
    QueueItem.objects.filter(id=sampled).update(trace_context=SAMPLED)
    QueueItem.objects.filter(id=not_sampled).update(trace_context=NOT_SAMPLED)
    proc = worker(
        "otel-sampling",
        "--import",
        "tests.tasks.tracing_sampling_tasks",
        "--queues",
        "otel_sampling",
        "--burst",
        env=otel_env(receiver, OTEL_TRACES_SAMPLER="parentbased_always_on"),
    )
    assert proc.wait(timeout=120) == 0, proc.log.read_text()[-3000:]
    follow_ups = dict(
        (item.payload["after"], item.trace_context) for item in QueueItem.objects.filter(queue_id="otel_sampling_next")
    )
    assert set(follow_ups) == {sampled, not_sampled}

    # The sampled item: its attempt's span (the stored parent's child) and, under it, the handler's enqueue.
    trace_id = SAMPLED.split("-")[1]
    spans = wait_for(
        lambda: (found := [s for s in receiver.spans() if s.trace_id == trace_id]) and len(found) >= 2 and found,
        30,
        what="the sampled item's attempt and its handler's enqueue",
    )
    (attempt,) = [s for s in spans if s.kind == "consumer"]
    (enqueue,) = [s for s in spans if s.kind == "producer"]
    assert attempt.parent_id == SAMPLED.split("-")[2] and attempt.attributes["jobsite.item_id"] == sampled
    assert enqueue.parent_id == attempt.span_id
    assert follow_ups[sampled].startswith(f"00-{trace_id}-{enqueue.span_id}-")
    assert tracing.sampled(follow_ups[sampled])

    # The not-sampled item: no span of its trace arrived (the worker exited: its spans were flushed), and the
    # follow-up it enqueued is in the same trace, not sampled.
    assert [s for s in receiver.spans() if s.trace_id == NOT_SAMPLED.split("-")[1]] == []
    version, follow_trace, follow_span, _ = follow_ups[not_sampled].split("-")
    assert (version, follow_trace) == ("00", NOT_SAMPLED.split("-")[1])
    assert not tracing.sampled(follow_ups[not_sampled])
    assert follow_span != NOT_SAMPLED.split("-")[2]
