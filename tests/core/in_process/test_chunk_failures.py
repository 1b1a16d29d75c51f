"""Chunk failure paths (issue 49, gap 6), in process: a chunked handler's call run by run_job and its outcome
settled by the worker's Settler, as the supervisor does, on items the engine leased. A handler that raises, or
returns the wrong number of outcomes, fails every item of the chunk, each on its own (its attempt spent, back to
ready for its retry, its error saying why); one item whose result is not JSON is a dead letter alone while the
others are done. (A handler past its hard timeout is a claim about the pool's processes: not here.)"""

import pytest

from queue_app import engine
from queue_app.models import DeadLetter, QueueItem
from queue_app.registry import get_task
from queue_app.worker.execute import Job, run_job
from queue_app.worker.options import Running
from queue_app.worker.settling import Settler
from tests.tasks import chunk_tasks  # noqa: F401 (registers the chunked tasks)

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "chunk_fail"


def run_chunk(task_name: str, n: int = 3) -> list[QueueItem]:
    """Enqueue `n` items of the task (a queue of its own), lease them, run them in one handler call and settle its
    outcome."""
    queue = f"{QUEUE}_{task_name.rsplit('_', 1)[-1]}"
    ids = engine.enqueue_many(task_name, [{"n": i} for i in range(n)], queue=queue)
    leases = engine.lease([queue], n, "w1", lease_timeout=60)
    assert sorted(held.item_id for held in leases) == sorted(ids)
    first = leases[0]
    members = [(h.reservation_id, h.item_id, h.payload, h.attempt, h.max_attempts) for h in leases]
    outcome = run_job(Job(first.reservation_id, first.item_id, queue, task_name, members, 1, first.max_attempts, "w1"))
    settler = Settler(lambda queues: None)
    settler.finish(Running(first, get_task(task_name), tuple(leases)), outcome)
    settler.complete_done()
    settler.settle_pending()
    return list(QueueItem.objects.filter(id__in=ids).order_by("id"))


def test_a_raising_or_miscounting_chunk_handler_fails_every_item_and_a_bad_result_is_a_dead_letter_alone():
    """One test, one database reset: run_job ends by closing a connection left in a transaction (as a worker does
    after each job), so these run on transactional_db."""
    raised = run_chunk("tests.chunked_raises")
    assert [(i.state, i.attempts) for i in raised] == [("ready", 1)] * 3  # each back to ready, its attempt spent
    assert {i.error for i in raised} == {"RuntimeError: the bulk call failed for 3 items"}

    short = run_chunk("tests.chunked_miscount")
    assert [(i.state, i.attempts) for i in short] == [("ready", 1)] * 3
    assert {i.error for i in short} == {"TypeError: a chunk handler returns one outcome per item: 3 items, got 2"}
    assert not DeadLetter.objects.exists()

    first, bad, third = run_chunk("tests.chunked_bad_result")
    assert (first.state, first.result, third.state, third.result) == ("done", {"ok": True}, "done", None)
    assert bad.state == "dead" and DeadLetter.objects.get().item_id == bad.id
