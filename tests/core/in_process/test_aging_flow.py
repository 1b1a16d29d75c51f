"""Priority aging together with the other rules of the lease (issue 49, gap 5), in process: an aged item that
ranks first still counts against its queue's concurrency and rate limits, and still waits behind the items of
its ordering key enqueued before it; with aging off, a queue is leased by the one statement of a queue that never
had it, and nothing more. The aged rank comes from backdating the item's due time (21 s at 10 points
a second lifts priority -100 above 100), as tests/core/processes/test_debounce_aging.py does."""

from datetime import timedelta

import pytest
from django.db.models import F

from queue_app import engine, services
from queue_app.models import QueueItem
from tests.support.prepared_statements import which_ran

pytestmark = pytest.mark.django_db
NOOP = "queue_app.noop"
AGED = timedelta(seconds=21)  # at 10 points/s, 210 points: -100 now ranks at 110


def enqueue(queue: str, priority: int, **options) -> int:
    return engine.enqueue(NOOP, {}, queue=queue, priority=priority, **options).id


def backdate(item_id: int) -> None:
    QueueItem.objects.filter(id=item_id).update(run_at=F("run_at") - AGED, visible_at=F("visible_at") - AGED)


HELD: dict[int, engine.Lease] = {}


def lease(queue: str, n: int = 10) -> list[int]:
    leases = engine.lease([queue], n, "w", lease_timeout=60)
    HELD.update((held.item_id, held) for held in leases)
    return [held.item_id for held in leases]


def complete(item_id: int) -> None:
    engine.complete(HELD.pop(item_id), None)


def test_an_aged_item_first_still_counts_against_the_concurrency_limit():
    services.configure_queue("aged_cc", aging_rate=10.0, concurrency_limit=1)
    high = [enqueue("aged_cc", 100) for _ in range(3)]
    low = enqueue("aged_cc", -100)
    backdate(low)
    assert lease("aged_cc") == [low]  # first by its aged rank, and alone: the limit is 1
    assert lease("aged_cc") == []  # held while it is out
    complete(low)  # the slot is free again
    (got,) = lease("aged_cc")
    assert got in high


def test_an_aged_item_first_still_counts_against_the_rate_limit():
    services.configure_queue("aged_rate", aging_rate=10.0, rate_limit=2, rate_period=3600)
    high = [enqueue("aged_rate", 100) for _ in range(3)]
    low = enqueue("aged_rate", -100)
    backdate(low)
    first = sorted(lease("aged_rate"))
    # Two leases an hour: the aged item (without aging two priority-100 items would go) and the best other one.
    assert len(first) == 2 and low in first and set(first) - {low} <= set(high)
    assert lease("aged_rate") == []


def test_an_aged_item_still_waits_behind_the_earlier_items_of_its_ordering_key():
    services.configure_queue("aged_key", aging_rate=10.0)
    head = enqueue("aged_key", -100, ordering_key="k")  # the key's first item, not aged
    aged = enqueue("aged_key", -100, ordering_key="k")  # ranks above everything once aged, but second in its key
    other = enqueue("aged_key", 100)
    backdate(aged)
    assert lease("aged_key", 1) == [other]  # the best item whose key lets it go: not the aged one
    assert lease("aged_key") == [head]  # the key's head; the aged item waits while it is out
    complete(head)
    assert lease("aged_key") == [aged]


def test_aging_off_leases_with_the_statement_of_a_queue_that_never_had_it_and_nothing_more():
    """What aging off costs: nothing. The lease of a queue whose aging was turned off runs the statement every
    queue without aging runs (sql.LEASE_OPEN, the same prepared statement: its plan and its cost), and no other;
    with aging on, the queue is leased apart (its row lock and the aged lease: a transaction more)."""
    statements = ("LEASE_OPEN", "SETTLE_AND_LEASE", "LOCK_FLOW_QUEUE", "IN_FLIGHT", "LEASE", "LEASE_AGED")
    for n in range(3):
        enqueue("plain", 0)
        enqueue("aging", n)
    plain = which_ran(lambda: lease("plain", 1), statements)
    services.set_queue_options("aging", aging_rate=10)
    on = which_ran(lambda: lease("aging", 1), statements)
    services.set_queue_options("aging", aging_rate=None)
    off = which_ran(lambda: lease("aging", 1), statements)

    assert plain == off == ["LEASE_OPEN"]
    assert on == ["LEASE_OPEN", "LOCK_FLOW_QUEUE", "LEASE_AGED"]
    assert QueueItem.objects.filter(queue_id="aging", state="reserved").count() == 2
