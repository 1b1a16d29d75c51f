"""Hand-off with real run_worker processes (engine/handoff.py): idle workers offer a slot, plain enqueues take the
offers, and every item runs once; an offer of a worker killed -9 is never taken (its item is queued ready and
another worker leases it); a worker stopping withdraws its offer; a notification that arrives while the worker
makes its offer still wakes it."""

import os
import signal

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from queue_app import engine
from queue_app.models import ExecutionLog, HandoffOffer, ItemState, QueueItem, Reservation, Worker
from tests.support.locks import blocked_by
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = "queue_app.probe"


def offered(worker_id: str) -> bool:
    return HandoffOffer.objects.filter(worker_id=worker_id).exists()


def started(proc) -> None:
    wait_for(lambda: "status state=running" in proc.log.read_text(), 30, what="the worker to start")


def test_idle_workers_take_plain_enqueues_by_hand_off_and_each_item_runs_once(worker):
    engine.ensure_queue("default")  # the first enqueue into a queue not yet created is never handed off
    procs = [worker(name, "--pool", "thread", "--concurrency", "2") for name in ("w-a", "w-b")]
    for proc in procs:
        started(proc)
    # This process learns of the offers by its first enqueue (engine/handoff.py: OFFERS_FRESH), not counted.
    wait_for(lambda: HandoffOffer.objects.exists(), 10, what="an offer")
    seen = engine.enqueue(PROBE, {"n": -1}).id
    wait_for(lambda: QueueItem.objects.filter(id=seen, state=ItemState.DONE).exists(), 20, what="the first probe")
    handed, items = 0, []
    for n in range(24):
        if n % 2 == 0:  # every other probe waits for an offer; the rest race the workers' offers
            wait_for(lambda: HandoffOffer.objects.exists(), 10, what="an offer")
        items.append(engine.enqueue(PROBE, {"n": n}).id)
        if n % 3 == 0:
            wait_for(lambda: not QueueItem.objects.exclude(state=ItemState.DONE).exists(), 20, what="the probes")
    wait_for(lambda: QueueItem.objects.filter(id__in=items, state=ItemState.DONE).count() == 24, 30, what="all")

    runs = list(ExecutionLog.objects.filter(item_id__in=items).values_list("item_id", flat=True))
    assert sorted(runs) == sorted(items)  # each once
    for reservation in Reservation.objects.filter(item_id__in=items).select_related("item"):
        handed += reservation.reserved_at == reservation.item.created_at  # reserved by its own enqueue
    # Half the probes wait for an offer; those sent right after one that found none probe first (OFFERS_FRESH).
    assert handed >= 6, handed
    assert set(Reservation.objects.filter(item_id__in=items).values_list("worker_id", flat=True)) <= {"w-a", "w-b"}
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.log.read_text()[-3000:]
    assert not HandoffOffer.objects.exists()  # each withdrew its offer as it stopped
    counted = sum(w.stats["handed_off"] for w in Worker.objects.filter(id__in=["w-a", "w-b"]))
    assert counted == handed  # each worker counts what it started from a hand-off (its row, /metrics)


def test_the_offer_of_a_worker_killed_is_never_taken(worker):
    engine.ensure_queue("default")
    dead = worker("w-dead", "--pool", "thread", "--concurrency", "2")
    started(dead)
    wait_for(lambda: offered("w-dead"), 10, what="its offer")
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait(10)
    assert offered("w-dead")  # left behind: nothing withdrew it

    item = engine.enqueue(PROBE, {})

    assert QueueItem.objects.get(id=item.id).state == ItemState.READY  # not handed to the dead worker
    alive = worker("w-alive", "--pool", "thread", "--concurrency", "2")
    wait_for(lambda: QueueItem.objects.filter(id=item.id, state=ItemState.DONE).exists(), 30, what="the probe")
    assert list(Reservation.objects.filter(item_id=item.id).values_list("worker_id", flat=True)) == ["w-alive"]
    wait_for(lambda: offered("w-alive"), 10, what="the live worker's offer")
    assert not offered("w-dead")  # cleared by the live worker's offer
    alive.send_signal(signal.SIGTERM)
    assert alive.wait(30) == 0


def test_a_notification_that_arrives_during_the_offer_still_wakes_the_worker(worker):
    """PostgreSQL sends a notification that arrives during a statement before the statement's result: psycopg
    reads it off the socket with the result and keeps it, and select() on the socket does not wake for it. Here
    the worker's OFFER waits on a row lock this test holds while an item is enqueued; the worker must start the
    item from that notification, not from its next poll 30 s later."""
    engine.ensure_queue("default")
    planted = HandoffOffer.objects.create(  # a row the worker's OFFER deletes (its own worker_id) and so waits on
        worker_id="w-late", channel="planted", lock_key=0, queues=None, terms={}, offered_at=timezone.now()
    )
    with psycopg.connect(**connection.get_connection_params()) as holder:
        holder.execute("SELECT 1 FROM queue_app_handoff WHERE id = %s FOR UPDATE", [planted.id])
        proc = worker("w-late", "--pool", "thread", "--concurrency", "1", "--poll-interval", "30", "--no-scheduler")
        waiting = wait_for(lambda: blocked_by(holder.info.backend_pid), 30, what="the OFFER to wait")
        assert "INSERT INTO queue_app_handoff" in waiting[0][1]
        with transaction.atomic():  # in a transaction: never handed off, queued ready with a NOTIFY at commit
            item = engine.enqueue(PROBE, {}).id
        holder.rollback()  # the OFFER goes on, and the notification comes with its result
    wait_for(lambda: ExecutionLog.objects.filter(item_id=item).exists(), 10, what="the run before the next poll")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.log.read_text()[-3000:]
