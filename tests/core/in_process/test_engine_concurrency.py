"""The engine under real concurrency: threads, each with its own PostgreSQL connection, against one database.

SKIP LOCKED (no item leased twice), dedup under racing enqueuers, ordering keys under racing workers, and
queue concurrency limits under racing leasers."""

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from queue_app import engine, services
from queue_app.models import DedupClaim, QueueItem, Reservation

LONG = 3600.0
pytestmark = pytest.mark.django_db(transaction=True)


class Threads:
    """Start functions in threads; each thread closes its own Django connection when it ends. join() re-raises
    the first error of any thread and fails if one hangs."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.results: dict[Any, Any] = {}

    def start(self, name: Any, fn: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.results[name] = fn()
            except BaseException as exc:
                self.errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, name=f"test-{name}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self, timeout: float = 120) -> dict[Any, Any]:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not [t.name for t in self.threads if t.is_alive()], "threads still running"
        if self.errors:
            raise self.errors[0]
        return self.results


def in_threads(n: int, work: Callable[[int], Any], timeout: float = 120) -> list[Any]:
    """Run work(0..n-1) in n threads that connect first, then start together at a barrier."""
    barrier = threading.Barrier(n)

    def ready_then(i: int) -> Callable[[], Any]:
        def run() -> Any:
            connection.ensure_connection()
            barrier.wait(timeout=60)
            return work(i)

        return run

    threads = Threads()
    for i in range(n):
        threads.start(i, ready_then(i))
    try:
        results = threads.join(timeout)
    finally:
        barrier.abort()
    return [results[i] for i in range(n)]


class Sampler:
    """Polls the database from its own thread until stopped, recording what `query` returns each time."""

    def __init__(self, query: str, params: dict | None = None) -> None:
        self.query, self.params = query, params or {}
        self.samples: list[Any] = []
        self.stop = threading.Event()
        self.threads = Threads()

    def __enter__(self) -> "Sampler":
        def poll() -> None:
            while not self.stop.is_set():
                with connection.cursor() as cur:
                    cur.execute(self.query, self.params)
                    self.samples.append(cur.fetchall())
                time.sleep(0.002)

        self.threads.start("sampler", poll)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.threads.join(30)


def wait_until_blocked_on_locks(n: int, timeout: float = 30) -> None:
    """Wait until n sessions of this test database wait for a lock (e.g. on an uncommitted dedup claim)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cur.fetchone()[0] >= n:
                return
        time.sleep(0.02)
    pytest.fail(f"{n} sessions never blocked on a lock")


# -- SKIP LOCKED --------------------------------------------------------------------------------------------


def test_concurrent_leasers_never_lease_an_item_twice_and_lease_every_item():
    ids = engine.enqueue_many("t", [{"n": n} for n in range(5000)], queue="skip")

    def worker(i: int) -> list[int]:
        taken: list[int] = []
        while batch := engine.lease(["skip"], 50, f"w{i}", lease_timeout=LONG):
            taken += [h.item_id for h in batch]
            assert engine.complete_many([(h, None) for h in batch]) == []
        return taken

    per_worker = in_threads(8, worker)

    taken = [item_id for items in per_worker for item_id in items]
    assert len(taken) == 5000  # no item twice...
    assert set(taken) == set(ids)  # ...and every item
    assert sum(1 for items in per_worker if items) > 1  # the leasers really ran side by side
    assert Reservation.objects.count() == 5000
    assert Reservation.objects.values("item_id").distinct().count() == 5000
    assert QueueItem.objects.filter(state="done").count() == 5000


# -- dedup --------------------------------------------------------------------------------------------------


def test_concurrent_enqueuers_of_one_dedup_key_create_exactly_one_item():
    rounds, n = 5, 16
    start_round = threading.Barrier(n)

    def enqueuer(i: int) -> list[engine.Enqueued]:
        out = []
        for r in range(rounds):
            start_round.wait(timeout=60)
            out.append(engine.enqueue("t", {"by": i}, dedup_key=f"key-{r}", queue="dedup"))
        return out

    per_thread = in_threads(n, enqueuer)

    for r in range(rounds):
        got = [results[r] for results in per_thread]
        assert sorted(e.duplicate for e in got) == [False] + [True] * (n - 1)
        assert len({e.id for e in got}) == 1
        assert QueueItem.objects.filter(dedup_key=f"key-{r}").count() == 1
        assert DedupClaim.objects.get(key=f"key-{r}").item_id == got[0].id
    assert QueueItem.objects.count() == rounds


def test_enqueuers_waiting_on_a_rolled_back_dedup_claim_agree_on_one_new_item():
    class Rollback(Exception):
        pass

    claimed, release = threading.Event(), threading.Event()

    def holder() -> int:
        try:
            with transaction.atomic():
                mine = engine.enqueue("t", {"by": "holder"}, dedup_key="k", queue="dedup")
                claimed.set()
                assert release.wait(60)
                raise Rollback
        except Rollback:
            return mine.id

    threads = Threads()
    threads.start("holder", holder)
    assert claimed.wait(30)
    for i in range(4):
        threads.start(i, lambda i=i: engine.enqueue("t", {"by": i}, dedup_key="k", queue="dedup"))
    wait_until_blocked_on_locks(4)  # every waiter is queued behind the holder's uncommitted claim
    release.set()
    results = threads.join()

    waiters = [results[i] for i in range(4)]
    assert sorted(e.duplicate for e in waiters) == [False, True, True, True]
    assert len({e.id for e in waiters}) == 1
    assert waiters[0].id != results["holder"]
    assert list(QueueItem.objects.values_list("id", flat=True)) == [waiters[0].id]


# -- ordering keys ------------------------------------------------------------------------------------------


def test_concurrent_workers_hand_out_each_ordering_key_one_at_a_time_in_enqueue_order():
    keys = "ABCD"
    by_key: dict[str, list[int]] = defaultdict(list)
    for n in range(6):
        for key in keys:
            by_key[key].append(engine.enqueue("t", {"key": key, "n": n}, ordering_key=key, queue="ord").id)
        engine.enqueue("t", {"n": n}, queue="ord")  # items without a key pass freely
    total = QueueItem.objects.count()
    head = by_key["A"][0]  # fails once: its key must stay blocked while it waits for its retry

    lock = threading.Lock()
    holding: Counter[str] = Counter()  # items of a key taken and not yet done: from lease until complete
    most_held: Counter[str] = Counter()
    completed: dict[str, list[int]] = defaultdict(list)
    finished: list[int] = []
    leased_during_backoff: list[int] = []
    head_backoff = threading.Event()

    def worker(i: int) -> None:
        deadline = time.monotonic() + 60
        while len(finished) < total and time.monotonic() < deadline:
            batch = engine.lease(["ord"], 3, f"w{i}", lease_timeout=LONG)
            if not batch:
                time.sleep(0.003)
                continue
            for held in batch:
                key = held.ordering_key
                with lock:
                    if head_backoff.is_set() and key == "A" and held.item_id != head:
                        leased_during_backoff.append(held.item_id)
                    if key and held.attempt == 1:
                        holding[key] += 1
                        most_held[key] = max(most_held[key], holding[key])
                    if held.item_id == head:
                        head_backoff.clear()
                time.sleep(random.uniform(0, 0.004))  # the handler
                if held.item_id == head and held.attempt == 1:
                    head_backoff.set()
                    assert engine.fail(held, "transient", retry_in=0.3) == "retry"
                    continue
                with lock:  # let go of the key before the settle commits: never counted as free too early
                    if key:
                        holding[key] -= 1
                        completed[key].append(held.item_id)
                    finished.append(held.item_id)
                engine.complete(held)

    sampler_sql = """
        SELECT ordering_key, count(*) FROM queue_app_queueitem
        WHERE queue_id = 'ord' AND state = 'reserved' AND ordering_key IS NOT NULL
        GROUP BY ordering_key HAVING count(*) > 1
    """
    with Sampler(sampler_sql) as sampler:
        in_threads(6, worker)

    assert sorted(finished) == sorted(QueueItem.objects.values_list("id", flat=True))
    assert dict(most_held) == {key: 1 for key in keys}  # at most one item of a key out at any moment
    assert dict(completed) == dict(by_key)  # and a key's items complete in enqueue order
    assert leased_during_backoff == []  # the retried head blocked its key until it was done
    assert Reservation.objects.filter(item_id=head).count() == 2
    assert len(sampler.samples) > 10
    assert [s for s in sampler.samples if s] == []  # the database never held two of a key either


def test_ordering_key_is_not_handed_out_twice_when_enqueues_commit_out_of_id_order():
    # Two enqueues of one key race: the one with the lower id commits last. Whatever order the key's items go
    # out in, they go out one at a time.
    engine.ensure_queue("default")  # committed: the two enqueues race on the item only
    took_id, go = threading.Event(), threading.Event()

    def slow_enqueuer() -> int:
        with transaction.atomic():
            queued = engine.enqueue("t", {"n": "slow"}, ordering_key="A")
            took_id.set()
            assert go.wait(20)
        return queued.id

    threads = Threads()
    threads.start("slow", slow_enqueuer)
    try:
        assert took_id.wait(30)
        fast = engine.enqueue("t", {"n": "fast"}, ordering_key="A").id
        (held,) = engine.lease(["default"], 10, "w1", lease_timeout=LONG)
    finally:
        go.set()
        slow = threads.join()["slow"]
    assert held.item_id == fast
    assert slow < fast

    assert engine.lease(["default"], 10, "w2", lease_timeout=LONG) == []

    engine.complete(held)
    assert [h.item_id for h in engine.lease(["default"], 10, "w2")] == [slow]


# -- concurrency limit --------------------------------------------------------------------------------------


def test_concurrent_leasers_never_exceed_the_queues_concurrency_limit():
    limit, total = 3, 60
    engine.enqueue_many("t", [{"n": n} for n in range(total)], queue="limited")
    services.set_queue_options("limited", concurrency_limit=limit)
    lock = threading.Lock()
    out = Counter()
    most = [0]
    finished: list[int] = []

    def worker(i: int) -> None:
        deadline = time.monotonic() + 60
        while len(finished) < total and time.monotonic() < deadline:
            batch = engine.lease(["limited"], 2, f"w{i}", lease_timeout=LONG)
            with lock:
                out["n"] += len(batch)
                most[0] = max(most[0], out["n"])
            if not batch:
                time.sleep(0.002)
                continue
            time.sleep(random.uniform(0, 0.004))
            with lock:
                out["n"] -= len(batch)
                finished.extend(h.item_id for h in batch)
            assert engine.complete_many([(h, None) for h in batch]) == []

    sampler_sql = "SELECT count(*) FROM queue_app_queueitem WHERE queue_id = 'limited' AND state = 'reserved'"
    with Sampler(sampler_sql) as sampler:
        in_threads(6, worker)

    assert len(finished) == len(set(finished)) == total
    assert most[0] <= limit
    assert max(rows[0][0] for rows in sampler.samples) <= limit


def test_a_single_batch_race_stays_within_the_concurrency_limit():
    engine.enqueue_many("t", [{}] * 30, queue="limited")
    services.set_queue_options("limited", concurrency_limit=4)

    got = in_threads(8, lambda i: len(engine.lease(["limited"], 3, f"w{i}", lease_timeout=LONG)))

    assert sum(got) == 4
    assert QueueItem.objects.filter(queue_id="limited", state="reserved").count() == 4


# -- settle racing maintenance ------------------------------------------------------------------------------


def test_settle_and_rescue_racing_on_an_expired_lease_never_both_win():
    n = 200
    engine.enqueue_many("t", [{}] * n, queue="race", max_attempts=3)
    leases = engine.lease(["race"], n, "w1", lease_timeout=0.2)
    time.sleep(0.6)
    barrier = threading.Barrier(2)

    def settle() -> list:
        barrier.wait(30)
        return engine.complete_many([(h, {"late": True}) for h in leases])

    def rescue() -> tuple[int, int]:
        barrier.wait(30)
        total = (0, 0)
        while True:
            got = engine.rescue_expired(limit=10)
            if got == (0, 0):
                return total
            total = (total[0] + got[0], total[1] + got[1])

    threads = Threads()
    threads.start("settle", settle)
    threads.start("rescue", rescue)
    results = threads.join()

    stale, (rescued, died) = results["settle"], results["rescue"]
    states = Counter(QueueItem.objects.filter(queue_id="race").values_list("state", flat=True))
    assert died == 0
    assert states == Counter({"done": n - len(stale), "ready": rescued})
    assert len(stale) == rescued
    outcomes = Counter(Reservation.objects.values_list("outcome", flat=True))
    assert outcomes == Counter({"done": n - rescued, "expired": rescued})
