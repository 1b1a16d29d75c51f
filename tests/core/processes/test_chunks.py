"""Chunked handlers (issue 41): one handler call for up to N items, each item settled on its own. The handler's
outcomes in process (run_job), bad policies refused at declaration; then real workers: one item of 100 failing ->
99 done, 1 retried; kill -9 mid-chunk -> every item re-delivered (at least once) or a dead letter (at most once); a
chunk past its hard timeout -> every item failed and retried on its own; a queue's concurrency limit and ordering
keys hold for a chunk's items as for any (issue 49)."""

import os
import signal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from queue_app import engine, services
from queue_app.models import DeadLetter, QueueItem, Reservation, Worker
from queue_app.registry import ChunkPolicy, job
from queue_app.worker.execute import Job, run_job
from tests.support.waiting import wait_for
from tests.support.worker_helpers import finish, short_leases
from tests.tasks import chunk_tasks  # noqa: F401 (registers the chunked tasks in this process too)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def empty_table_statistics():
    yield
    with connection.cursor() as cur:
        cur.execute("TRUNCATE queue_app_queueitem, queue_app_reservation CASCADE")
        cur.execute("ANALYZE queue_app_queueitem")
        cur.execute("ANALYZE queue_app_reservation")


def test_a_chunk_handler_returns_an_outcome_per_item():
    members = [(10 + n, 100 + n, payload, 1, 3) for n, payload in enumerate([{}, {"retry_once": True}, {"dead": True}])]
    outcome = run_job(Job(10, 100, "chunks", "tests.chunked", members, 1, 3, "w"))
    assert outcome.status == "chunk"
    done, retried, dead = outcome.result
    assert (done.reservation_id, done.status, done.result) == (10, "ok", {"chunk": 3, "attempt": 1})
    assert (retried.reservation_id, retried.status, retried.retryable) == (11, "failed", True)
    assert (dead.reservation_id, dead.status, dead.retryable) == (12, "failed", False)
    assert "cannot ever succeed" in dead.error


def test_bad_chunk_policies_are_refused():
    for size in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="size must be an integer >= 1"):
            ChunkPolicy(size=size)
    with pytest.raises(ValueError, match="timeout"):
        ChunkPolicy(size=10, timeout=-1)
    with pytest.raises(ImproperlyConfigured, match="not transactionally"):
        job("tests.never_registered", chunk=ChunkPolicy(), delivery="transactional")
    with pytest.raises(TypeError, match="ChunkPolicy"):
        job("tests.never_registered", chunk=100)


def _states(*groups: list[int]) -> list:
    return [list(QueueItem.objects.filter(id__in=ids).values_list("state", "attempts", "error")) for ids in groups]


def chunk_worker(worker, name: str, *args: str, pool: str = "thread"):
    return worker(name, "--import", "tests.tasks.chunk_tasks", "--queues", "chunks", "--pool", pool, *args)


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_one_item_of_a_hundred_failing_leaves_99_done_and_1_retried(worker):
    payloads = [{"retry_once": n == 37} for n in range(100)]
    ids = engine.enqueue_many("tests.chunked", payloads, queue="chunks")
    # Child processes: the chunk and its outcomes cross the pool's pipe.
    proc = chunk_worker(worker, "chunk1", "--concurrency", "1", "--prefetch", "200", "--batch", "200", pool="process")
    wait_for(
        lambda: QueueItem.objects.filter(id__in=ids, state="done").count() == 100, timeout=60, what="100 items done"
    )
    proc.terminate()
    assert finish(proc, timeout=30) == 0
    items = {item.id: item for item in QueueItem.objects.filter(id__in=ids)}
    failed = ids[37]
    assert items[failed].attempts == 2 and items[failed].result["attempt"] == 2
    assert all(items[i].attempts == 1 for i in ids if i != failed)
    assert max(items[i].result["chunk"] for i in ids if i != failed) == 100  # one handler call took all 100
    assert not DeadLetter.objects.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_kill_9_mid_chunk_redelivers_each_item_per_its_delivery_mode(worker, tmp_path):
    short_leases("chunks")  # the hard timeout (3 s) plus margin: the killed worker's leases lapse within seconds
    least = engine.enqueue_many(
        "tests.chunked_short", [{"sleep": 30, "marker": str(tmp_path / "least")}] * 5, queue="chunks"
    )
    most = engine.enqueue_many(
        "tests.chunked_at_most_once", [{"sleep": 30, "marker": str(tmp_path / "most")}] * 5, queue="chunks"
    )
    victim = chunk_worker(worker, "victim", "--concurrency", "2")
    wait_for(
        lambda: (tmp_path / "least").exists() and (tmp_path / "most").exists(), timeout=60, what="both chunks running"
    )
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    QueueItem.objects.filter(id__in=least).update(payload={})  # the next attempt runs at once
    rescuer = chunk_worker(worker, "rescuer", "--concurrency", "2")
    try:
        wait_for(
            lambda: (
                QueueItem.objects.filter(id__in=least, state="done").count() == 5
                and QueueItem.objects.filter(id__in=most, state="dead").count() == 5
            ),
            timeout=60,
            what="the at-least-once items run again, the at-most-once ones dead letters",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_states(least, most)}\n{rescuer.log.read_text()[-3000:]}") from None
    rescuer.terminate()
    assert finish(rescuer, timeout=30) == 0, rescuer.log.read_text()[-3000:]
    assert all(item.attempts == 2 for item in QueueItem.objects.filter(id__in=least))
    assert DeadLetter.objects.filter(item_id__in=most, reason__contains="at-most-once").count() == 5
    assert Worker.objects.filter(id="victim").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_a_chunk_past_its_hard_timeout_fails_every_item_each_retried_on_its_own(worker, tmp_path):
    # One chunk of five; its first item sleeps past the task's hard timeout (2 s) on its first attempt.
    ids = engine.enqueue_many(
        "tests.chunked_hard", [{"sleep_first": 60, "marker": str(tmp_path / "started")}] + [{}] * 4, queue="chunk_hard"
    )
    proc = worker(
        "hard", "--import", "tests.tasks.chunk_tasks", "--queues", "chunk_hard", "--pool", "process",
        "--concurrency", "1", "--batch", "10", "--prefetch", "10",
    )  # fmt: skip
    try:
        wait_for(
            lambda: QueueItem.objects.filter(id__in=ids, state="done").count() == 5, timeout=60, what="5 items done"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_states(ids)}\n{proc.log.read_text()[-3000:]}") from None
    proc.terminate()
    assert finish(proc, timeout=30) == 0, proc.log.read_text()[-3000:]
    assert (tmp_path / "started").exists()
    # Every item of the chunk: its first attempt failed by the hard timeout, settled on its own reservation; its
    # second ran (the whole chunk again, retried at once) and is done.
    first = Reservation.objects.filter(item_id__in=ids, attempt=1)
    assert sorted(first.values_list("item_id", flat=True)) == sorted(ids)
    assert {(r.outcome, r.error.split(":")[0]) for r in first} == {("timed_out", "hard timeout")}, [
        (r.outcome, r.error) for r in first
    ]
    assert "its child process was killed" in first[0].error
    items = QueueItem.objects.filter(id__in=ids)
    assert sorted((i.attempts, i.result["attempt"]) for i in items) == [(2, 2)] * 5
    assert not DeadLetter.objects.exists()


def _most_at_once(reservations) -> int:
    """The most of these reservations held at one moment (reserved_at to finished_at)."""
    edges = sorted([(r.reserved_at, 1) for r in reservations] + [(r.finished_at, -1) for r in reservations])
    held = most = 0
    for _, step in edges:  # at equal times an end (-1) sorts before a start: touching is not overlapping
        held += step
        most = max(most, held)
    return most


def _drain(worker, queue: str, ids: list[int]) -> None:
    """A worker of four slots on `queue` (chunked tasks loaded) until every one of `ids` is done, then stopped."""
    proc = worker(
        queue, "--import", "tests.tasks.chunk_tasks", "--queues", queue,
        "--concurrency", "4", "--batch", "100", "--prefetch", "100",
    )  # fmt: skip
    wait_for(
        lambda: QueueItem.objects.filter(id__in=ids, state="done").count() == len(ids), timeout=60, what="all done"
    )
    proc.terminate()
    assert finish(proc, timeout=30) == 0, proc.log.read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_a_chunk_takes_no_more_items_than_its_queues_concurrency_limit_leaves_room_for(worker):
    ids = engine.enqueue_many("tests.chunked", [{"sleep": 0.02}] * 12, queue="chunk_limited")
    services.set_queue_options("chunk_limited", concurrency_limit=3)
    _drain(worker, "chunk_limited", ids)
    chunks = [item.result["chunk"] for item in QueueItem.objects.filter(id__in=ids)]
    assert max(chunks) == 3, chunks  # a chunk took the room the limit left (the chunk's size is 100), never more
    assert _most_at_once(Reservation.objects.filter(item_id__in=ids)) <= 3


@pytest.mark.slow
@pytest.mark.usefixtures("empty_table_statistics")
def test_a_chunk_holds_one_item_of_an_ordering_key_at_a_time_and_each_keys_in_enqueue_order(worker):
    by_key = {
        key: engine.enqueue_many("tests.chunked", [{}] * 4, queue="chunk_ordered", ordering_key=key) for key in "abc"
    }
    ids = [i for key_ids in by_key.values() for i in key_ids]
    _drain(worker, "chunk_ordered", ids)
    assert max(item.result["chunk"] for item in QueueItem.objects.filter(id__in=ids)) <= 3  # one of each key
    for key_ids in by_key.values():
        held = list(Reservation.objects.filter(item_id__in=key_ids).order_by("item_id"))
        assert [r.item_id for r in held] == key_ids  # one attempt each
        # Each item of the key leased only after the one before it was settled: one in flight, in enqueue order.
        assert all(later.reserved_at >= earlier.finished_at for earlier, later in zip(held, held[1:], strict=False)), [
            (r.item_id, r.reserved_at, r.finished_at) for r in held
        ]
