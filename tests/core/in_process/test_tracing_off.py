"""Tracing off costs one flag check (issue 49, gap 7): with `tracing.enabled` false, the paths that trace when it is
on (enqueue, bulk enqueue, lease, a handler's run, complete, fail and retry, requeue, a workflow's start and its
steps' settles) call nothing of engine/tracing.py but read that flag: every helper, and the tracer, is replaced by
one that fails the test if called. In process."""

import pytest

from queue_app import engine, services
from queue_app.engine import tracing
from queue_app.models import QueueItem
from queue_app.worker.execute import Job, run_job
from queue_app.workflows import services as workflows
from queue_app.workflows.definition import Graph

pytestmark = pytest.mark.django_db(transaction=True)  # run_job drops a connection left inside a transaction
# The layers' span helpers (workflows/spans.py, spark/spans.py) reach the tracer, which is forbidden too.
HELPERS = (
    "producer", "bulk_items", "start_attempt", "end_attempt", "event_span", "scalars",
    "traceparent", "current_ids", "context_of", "attach", "detach", "sampled",
)  # fmt: skip


class Forbidden:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"tracing.{self.name} called with tracing off")

    def __getattr__(self, attribute: str):
        raise AssertionError(f"tracing.{self.name}.{attribute} used with tracing off")


@pytest.fixture
def tracing_untouchable(monkeypatch):
    assert not tracing.enabled  # the environment of the test run does not ask for it
    for name in HELPERS:
        assert callable(getattr(tracing, name)), name
        monkeypatch.setattr(tracing, name, Forbidden(name))
    monkeypatch.setattr(tracing, "tracer", Forbidden("tracer"))


def run(held) -> object:
    outcome = run_job(Job(held.reservation_id, held.item_id, held.queue, held.task, held.payload, 1, 3, "w1"))
    assert outcome.status == "ok", outcome
    return outcome.result


def test_tracing_off_reads_the_flag_and_nothing_else(tracing_untouchable):
    one = engine.enqueue("queue_app.echo", {"n": 1}, queue="off")
    engine.enqueue_many("queue_app.echo", [{"n": 2}, {"n": 3}], queue="off")
    leases = engine.lease(["off"], 3, "w1", lease_timeout=60)
    assert len(leases) == 3
    engine.complete(leases[0], run(leases[0]))
    engine.fail(leases[1], "once", retry_in=0)
    engine.dead(leases[2], "poison")
    services.requeue_items([leases[2].item_id])

    g = Graph("off")
    first = g.task("queue_app.echo", {"step": 1}, name="first")
    g.task("queue_app.echo", {"step": 2}, name="second", after=[first])
    w = workflows.start_graph(g)
    for _ in range(2):  # each step's item leased, run and completed: the settle trigger moves the workflow on
        (held,) = engine.lease(["default"], 1, "w1", lease_timeout=60)
        engine.complete(held, run(held))
    w.refresh_from_db()
    assert w.state == "succeeded"
    assert QueueItem.objects.get(id=one.id).state == "done"
    assert not QueueItem.objects.exclude(trace_context=None).exists()
