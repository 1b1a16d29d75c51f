"""At-most-once tasks as workflow steps, with real workers: the step runs once and its result flows on; a worker
killed while the step's handler runs leaves its item a dead letter, and the dead step fails the workflow per its
policy (what waits for it is cancelled, never enqueued) instead of running again."""

import signal

import pytest

from queue_app.engine.sql import DeadReason
from queue_app.models import DeadLetter, ExecutionLog, QueueItem
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from tests.support.waiting import wait_for
from tests.support.workflow_helpers import finished, items_of, steps
from tests.tasks import workflow_tasks  # noqa: F401  (registers the wf.* tasks)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = "queue_app.probe_at_most_once"  # logs each run (ExecutionLog) before it sleeps
QUICK = {"JOBSITE_WORKER_LOST_AFTER": "3"}  # a killed worker's leases come back in seconds


def start_worker(worker, name: str):
    return worker(name, "--import", "tests.tasks.workflow_tasks", "--pool", "thread", "--concurrency", "2", env=QUICK)


def test_an_at_most_once_step_runs_once_and_its_dependents_run_after_it(worker):
    graph = Graph("amo ok")
    first = graph.task(PROBE, {}, name="once")
    graph.task("wf.add", {"x": 7}, name="after", after=[first])
    w = services.start_graph(graph)
    start_worker(worker, "amo-ok")
    w = finished(w.id)
    assert w.state == "succeeded", w.error
    s = steps(w)
    (item,) = items_of(w)["once"]
    assert (item.max_attempts, item.attempts) == (1, 1)  # its one attempt, as any at-most-once item
    assert ExecutionLog.objects.filter(item_id=item.id).count() == 1
    assert s["once"].result["attempt"] == 1  # the handler's return value is the step's result
    assert s["after"].state == "succeeded" and s["after"].result == 7


def test_an_at_most_once_step_whose_worker_dies_mid_run_is_a_dead_letter_and_fails_the_workflow(worker):
    graph = Graph("amo killed")
    first = graph.task(PROBE, {"sleep": 30}, name="once")
    graph.task("wf.add", {"x": 7}, name="after", after=[first])
    w = services.start_graph(graph)
    victim = start_worker(worker, "amo-victim")
    wait_for(lambda: ExecutionLog.objects.filter(worker_id="amo-victim").exists(), 60, what="the step to start")
    victim.send_signal(signal.SIGKILL)  # the handler is asleep mid-run
    victim.wait(10)
    start_worker(worker, "amo-rescuer")  # rescues the lease of the silent victim
    w = finished(w.id)
    assert w.state == "failed"
    s = steps(w)
    (item,) = items_of(w)["once"]
    assert QueueItem.objects.get(id=item.id).state == "dead"
    assert DeadLetter.objects.get(item_id=item.id).reason == DeadReason.AT_MOST_ONCE_STOPPED
    assert ExecutionLog.objects.filter(item_id=item.id).count() == 1  # never run again
    assert s["once"].state == "failed" and s["once"].error == DeadReason.AT_MOST_ONCE_STOPPED_ERROR
    assert s["after"].state == "cancelled" and s["after"].item_id is None  # never enqueued
