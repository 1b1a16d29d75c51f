"""Stateful property tests of the queue engine against the real database (hypothesis RuleBasedStateMachine).

Hypothesis drives random interleavings of enqueue (dedup and ordering keys, priorities, delays, small
max_attempts), enqueue_many, lease and settle_and_lease by a few workers, complete / complete_many / fail /
dead / extend / release with held leases, the same settles with stale or forged leases (and a stalled holder
settling late after another worker took its expired lease over), clock moves, rescue of expired leases, dedup
claim pruning, and the services' requeue, retry_now and cancel. A Python model predicts every outcome (which
items a lease hands out, what each settle returns, every row's state); after every step the whole database is
read back and compared with the model, and model-free invariants are checked on the rows alone: one open
reservation per item and it is the item's current one, attempts never above max_attempts, dedup (one item per
key within its window), ordering (one item of a key in flight, never a younger one before an older one),
counts conserved, and stale settles changing nothing at all.

The clock. The engine reads time only through PostgreSQL's now() and takes no clock parameter, so the test
moves the clock the honest way round: advancing it by D seconds moves every stored timestamp back by D (items,
reservations, dead letters, dedup claims), which is exactly what every `x < now()` comparison would see after
D seconds. The model keeps a virtual clock in whole seconds. Every duration the test uses (delays, backoffs,
leases, dedup windows, clock moves) is a multiple of GRAIN = 60 s, so the real milliseconds that pass during
an example (far below a minute) never flip a comparison: "due" in the database is exactly "visible <= now" in
the model, and equal virtual deadlines are ordered by the operation that set them, as the real ones are.

Size: JOBSITE_HYPOTHESIS_EXAMPLES (default 50) and JOBSITE_HYPOTHESIS_STEPS (default 40) run it longer.
"""

import os
from dataclasses import dataclass, field

import pytest
from django.db import connection, transaction
from django.test import override_settings
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from queue_app import engine, services
from tests.support.queue_helpers import advance_database_clock

GRAIN = 60  # seconds; every duration below is a multiple, see the module docstring
QUEUES = ("qa", "qb")
DEDUP_KEYS = ("d1", "d2", "d3")
DEBOUNCE_KEYS = ("b1", "b2")
ORDERING_KEYS = ("k1", "k2")
WORKERS = ("w1", "w2", "w3")
OPEN = ("ready", "reserved")
STATES = ("ready", "reserved", "done", "dead", "cancelled")
SETTLES = ("complete", "fail", "dead", "extend", "release")
QA_LEASE, QA_MAX_ATTEMPTS = 120, 2  # qa is created up front with its own options
DEFAULTS = {"DEFAULT_LEASE_TIMEOUT": 60.0, "DEFAULT_MAX_ATTEMPTS": 3, "DEDUP_WINDOW": 300.0}  # qb takes these
TABLES = ("queue_app_reservation", "queue_app_deadletter", "queue_app_dedupclaim", "queue_app_queueitem")

EXAMPLES = int(os.environ.get("JOBSITE_HYPOTHESIS_EXAMPLES", "50"))
STEPS = int(os.environ.get("JOBSITE_HYPOTHESIS_STEPS", "40"))


@dataclass
class MRes:
    id: int
    attempt: int
    worker: str
    outcome: str | None = None
    revived: bool = False  # extended after its deadline had passed (see check_ordering)


@dataclass
class MItem:
    id: int
    queue: str
    priority: int
    max_attempts: int
    lease_timeout: int | None
    dedup_key: str | None
    ordering_key: str | None
    created: int  # virtual time of the enqueue
    visible: int  # virtual visible_at: due time while ready, lease deadline while reserved
    seq: int  # the operation that set `visible` (ties of equal virtual times go in operation order, then id)
    due: int = 0  # virtual run_at: its first due time, or its retry's (a rescue puts it back in line there)
    due_seq: int = 0  # the operation that set `due`
    state: str = "ready"
    attempts: int = 0
    reservation_id: int | None = None
    reservations: list[MRes] = field(default_factory=list)
    dead_letters: int = 0
    open_dead_letters: int = 0
    requeue_mark: int = 0  # reservations before this index belong to attempts before the last requeue
    debounce_key: str | None = None
    until: int | None = None  # virtual debounce_until: the latest due time a debounce may push it to
    until_seq: int = 0  # the operation that set it (its real time is that operation's)
    absorbed: int = 0


@dataclass(frozen=True)
class Forged:
    """A settle naming a real reservation id with another item's id: the fencing must refuse it too."""

    reservation_id: int
    item_id: int
    attempt: int


@dataclass
class Snapshot:
    items: dict[int, tuple]
    reservations: list[tuple]
    dead_letters: list[tuple]
    claims: dict[tuple[str, str], tuple]


def read_snapshot() -> Snapshot:
    """Every row of the queue tables, timestamps as seconds relative to one now() (one transaction)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "SELECT id, queue_id, state, priority, attempts, max_attempts, lease_timeout, dedup_key, ordering_key,"
            " reservation_id, extract(epoch FROM visible_at - now())::float8,"
            " extract(epoch FROM created_at - now())::float8 FROM queue_app_queueitem ORDER BY id"
        )
        items = {row[0]: row for row in cur.fetchall()}
        cur.execute(
            "SELECT id, item_id, attempt, worker_id, outcome, extract(epoch FROM lease_expires_at - now())::float8"
            " FROM queue_app_reservation ORDER BY id"
        )
        reservations = cur.fetchall()
        cur.execute("SELECT id, item_id, requeued_at IS NULL FROM queue_app_deadletter ORDER BY id")
        dead_letters = cur.fetchall()
        cur.execute(
            "SELECT queue_id, key, item_id, extract(epoch FROM expires_at - now())::float8 FROM queue_app_dedupclaim"
        )
        claims = {(row[0], row[1]): row for row in cur.fetchall()}
    return Snapshot(items, reservations, dead_letters, claims)


def raw_rows() -> list[list[str]]:
    """The queue tables verbatim, every column: what a stale settle must leave exactly as it was."""
    with transaction.atomic(), connection.cursor() as cur:
        out = []
        for table in TABLES:
            cur.execute(f"SELECT row_to_json(t)::text FROM {table} t ORDER BY 1")
            out.append([row[0] for row in cur.fetchall()])
    return out


class EngineMachine(RuleBasedStateMachine):
    """The engine driven by hypothesis, with the model beside it. Hypothesis favours the rule with the fewest
    arguments (first in its sort), so that one is `lease_one`, the step that moves work forward."""

    def __init__(self) -> None:
        super().__init__()
        with connection.cursor() as cur:  # each example starts from empty queue tables
            for table in TABLES:
                cur.execute(f"DELETE FROM {table}")
            cur.execute("DELETE FROM queue_app_queue WHERE name = ANY(%s)", [list(QUEUES)])
        engine.ensure_queue("qa")
        services.set_queue_options("qa", lease_timeout=float(QA_LEASE), max_attempts=QA_MAX_ATTEMPTS)
        self.queue_lease = {"qa": QA_LEASE, "qb": int(DEFAULTS["DEFAULT_LEASE_TIMEOUT"])}
        self.queue_max_attempts = {"qa": QA_MAX_ATTEMPTS, "qb": DEFAULTS["DEFAULT_MAX_ATTEMPTS"]}
        self.now = 0  # virtual clock, seconds
        self.seq = 0
        self.items: dict[int, MItem] = {}
        self.claims: dict[tuple[str, str], list[int]] = {}  # (queue, key) -> [item id, virtual expiry]
        self.held: dict[int, engine.Lease] = {}  # item id -> the lease holding it now
        self.stale: list[engine.Lease] = []
        self.enqueued = 0  # items created (duplicates not counted)

    # -- model helpers ----------------------------------------------------------------------------------------

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def set_visible(self, item: MItem, at: int, seq: int) -> None:
        item.visible, item.seq = at, seq

    def drop_held(self, item_id: int) -> None:
        lease = self.held.pop(item_id, None)
        if lease is not None:
            self.stale = [lease, *self.stale[:15]]  # newest first: the simplest draw is the freshest stale lease

    def current(self, item: MItem) -> MRes:
        return next(r for r in item.reservations if r.id == item.reservation_id)

    def blocks(self, other: MItem, item: MItem) -> bool:
        """Does `other` keep `item` from being leased (same ordering key)? An older open item does, and so does
        a younger one in flight."""
        return (
            other.id != item.id
            and other.queue == item.queue
            and other.ordering_key == item.ordering_key
            and other.state in OPEN
            and (other.id < item.id or (other.state == "reserved" and other.visible > self.now))
        )

    def leasable(self, item: MItem) -> bool:
        if item.state == "ready":
            ok = True
        elif item.state == "reserved":
            ok = item.attempts < item.max_attempts  # expired on its last attempt: only rescue takes it
        else:
            return False
        if not ok or item.visible > self.now:
            return False
        return item.ordering_key is None or not any(self.blocks(o, item) for o in self.items.values())

    def pick(self, data, states: tuple[str, ...]) -> list[int]:
        """A few items, mostly in `states` (the action's): the services must leave the others alone."""
        fit = sorted(i for i, it in self.items.items() if it.state in states) or sorted(self.items)
        ids = data.draw(st.lists(st.sampled_from(fit), min_size=1, max_size=2, unique=True))
        return sorted(set(ids + data.draw(st.lists(st.sampled_from(sorted(self.items)), max_size=1))))

    def stale_completes(self, leases) -> list[int]:
        """Reservation ids of the leases whose complete must be refused as stale. A complete repeated by the
        reservation that completed the item succeeds and changes nothing (the worker may not have seen the
        first reply: engine commit 6532404)."""
        return sorted(
            h.reservation_id
            for h in leases
            if not (self.items[h.item_id].state == "done" and self.items[h.item_id].reservation_id == h.reservation_id)
        )

    def settle(self, item: MItem, outcome: str) -> None:
        self.current(item).outcome = outcome
        self.drop_held(item.id)

    def die(self, item: MItem) -> None:
        item.state = "dead"
        item.dead_letters += 1
        item.open_dead_letters += 1

    # -- enqueue ----------------------------------------------------------------------------------------------

    @rule(
        queue=st.sampled_from(QUEUES),
        dedup_key=st.none() | st.sampled_from(DEDUP_KEYS),
        dedup_window=st.sampled_from([None, 2 * GRAIN]),
        ordering_key=st.none() | st.sampled_from(ORDERING_KEYS),
        priority=st.sampled_from([0, 0, 1, -1]),
        max_attempts=st.sampled_from([None, 1, 2, 3]),
        delay=st.sampled_from([0, 0, GRAIN, 10 * GRAIN]),
        lease_timeout=st.sampled_from([None, None, 3 * GRAIN]),
    )
    def enqueue(self, queue, dedup_key, dedup_window, ordering_key, priority, max_attempts, delay, lease_timeout):
        self.enqueue_one(queue, dedup_key, dedup_window, ordering_key, priority, max_attempts, delay, lease_timeout)

    @rule(
        queue=st.sampled_from(QUEUES),
        dedup_key=st.sampled_from(DEDUP_KEYS),
        ordering_key=st.sampled_from(ORDERING_KEYS),
        max_attempts=st.sampled_from([1, 2]),
    )
    def enqueue_keyed(self, queue, dedup_key, ordering_key, max_attempts):
        """Due at once, with both keys: more enqueues than other steps, and keys colliding often."""
        self.enqueue_one(queue, dedup_key, None, ordering_key, 0, max_attempts, 0, None)

    def enqueue_one(self, queue, dedup_key, dedup_window, ordering_key, priority, max_attempts, delay, lease_timeout):
        got = engine.enqueue(
            "t",
            {"n": self.seq},
            queue=queue,
            dedup_key=dedup_key,
            dedup_window=dedup_window,
            ordering_key=ordering_key,
            priority=priority,
            max_attempts=max_attempts,
            delay=delay or None,
            lease_timeout=None if lease_timeout is None else float(lease_timeout),
        )
        seq = self.tick()
        claim = self.claims.get((queue, dedup_key)) if dedup_key else None
        if claim is not None and claim[1] > self.now:
            assert got.duplicate and got.id == claim[0], f"inside the window: expected duplicate of {claim[0]}"
            event("enqueue: duplicate")
            return
        assert not got.duplicate and got.id not in self.items, f"expected a new item, got {got}"
        self.items[got.id] = MItem(
            id=got.id,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts or self.queue_max_attempts[queue],
            lease_timeout=lease_timeout,
            dedup_key=dedup_key,
            ordering_key=ordering_key,
            created=self.now,
            visible=self.now + delay,
            seq=seq,
            due=self.now + delay,
            due_seq=seq,
        )
        self.enqueued += 1
        if dedup_key:
            window = int(DEFAULTS["DEDUP_WINDOW"]) if dedup_window is None else dedup_window
            self.claims[(queue, dedup_key)] = [got.id, self.now + window]

    @rule(
        queue=st.sampled_from(QUEUES),
        key=st.sampled_from(DEBOUNCE_KEYS),
        debounce=st.sampled_from([GRAIN, 2 * GRAIN]),
        debounce_max=st.sampled_from([None, 2 * GRAIN, 3 * GRAIN]),
    )
    def enqueue_debounced(self, queue, key, debounce, debounce_max):
        """Debounce (issue 41): the key's ready, never leased item takes the enqueue (its due time pushed to
        now + debounce, never past its maximum wait), else a new item."""
        if debounce_max is not None and debounce_max < debounce:
            debounce_max = None
        got = engine.enqueue(
            "t", {"n": self.seq}, queue=queue, debounce_key=key, debounce=debounce, debounce_max=debounce_max
        )
        seq = self.tick()
        target = next(
            (
                it
                for it in self.items.values()
                if it.queue == queue and it.debounce_key == key and it.state == "ready" and it.reservation_id is None
            ),
            None,
        )
        if target is not None:
            target.absorbed += 1
            assert got.id == target.id and got.absorbed == target.absorbed, f"expected {target.id} to absorb: {got}"
            # LEAST(now + debounce, debounce_until): on equal virtual times the stored until is the earlier one.
            if target.until is not None and target.until <= self.now + debounce:
                at, at_seq = target.until, target.until_seq
            else:
                at, at_seq = self.now + debounce, seq
            self.set_visible(target, at, at_seq)
            target.due, target.due_seq = at, at_seq
            event("enqueue: debounced into the key's item")
            return
        assert got.absorbed == 0 and got.id not in self.items, f"expected a new debounced item, got {got}"
        self.items[got.id] = MItem(
            id=got.id,
            queue=queue,
            priority=0,
            max_attempts=self.queue_max_attempts[queue],
            lease_timeout=None,
            dedup_key=None,
            ordering_key=None,
            created=self.now,
            visible=self.now + debounce,
            seq=seq,
            due=self.now + debounce,
            due_seq=seq,
            debounce_key=key,
            until=None if debounce_max is None else self.now + debounce_max,
            until_seq=seq,
        )
        self.enqueued += 1

    @rule(
        queue=st.sampled_from(QUEUES),
        n=st.integers(1, 3),
        ordering_key=st.none() | st.sampled_from(ORDERING_KEYS),
        priority=st.sampled_from([0, 1]),
        max_attempts=st.sampled_from([None, 1, 2]),
        delay=st.sampled_from([0, GRAIN]),
    )
    def enqueue_many(self, queue, n, ordering_key, priority, max_attempts, delay):
        ids = engine.enqueue_many(
            "t",
            [{"i": i} for i in range(n)],
            queue=queue,
            ordering_key=ordering_key,
            priority=priority,
            max_attempts=max_attempts,
            delay=delay or None,
        )
        seq = self.tick()
        assert len(ids) == n and ids == sorted(ids) and not set(ids) & set(self.items)
        for item_id in ids:
            self.items[item_id] = MItem(
                id=item_id,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts or self.queue_max_attempts[queue],
                lease_timeout=None,
                dedup_key=None,
                ordering_key=ordering_key,
                created=self.now,
                visible=self.now + delay,
                seq=seq,
                due=self.now + delay,
                due_seq=seq,
            )
        self.enqueued += n

    # -- lease ------------------------------------------------------------------------------------------------

    @rule(
        queues=st.sampled_from([("qa",), ("qb",), ("qa", "qb"), None]),
        n=st.integers(1, 4),
        worker=st.sampled_from(WORKERS),
        lease_timeout=st.sampled_from([None, GRAIN, 10 * GRAIN]),
    )
    def lease_some(self, queues, n, worker, lease_timeout):
        self.lease(queues, n, worker, lease_timeout)

    def lease(self, queues, n, worker, lease_timeout):
        before = read_snapshot()
        expected = self.predict_lease(queues, n)
        got = engine.lease(None if queues is None else list(queues), n, worker, lease_timeout=lease_timeout)
        seq = self.tick()
        self.take(before, expected, got, worker, lease_timeout, seq)
        event(f"lease: {len(got)} of {n}")

    def predict_lease(self, queues, n: int, exclude: frozenset[int] = frozenset()) -> list[int]:
        names = QUEUES if queues is None else queues
        candidates = [it for it in self.items.values() if it.queue in names and it.id not in exclude]
        candidates = [it for it in candidates if self.leasable(it)]
        candidates.sort(key=lambda it: (-it.priority, it.visible, it.seq, it.id))
        return sorted(it.id for it in candidates[:n])

    def take(self, before: Snapshot, expected: list[int], got: list[engine.Lease], worker, lease_timeout, seq):
        """Check what a lease handed out against the model's prediction and the rows before it; record it."""
        assert sorted(h.item_id for h in got) == expected, "lease picked other items"
        self.check_lease_against_rows(before, got)
        for lease in got:
            item = self.items[lease.item_id]
            if item.state == "reserved":  # its lease expired: the old reservation ends, its holder is stale
                event("lease: took an expired lease over")
                self.current(item).outcome = "expired"
                self.drop_held(item.id)
            item.attempts += 1
            assert lease.attempt == item.attempts and lease.max_attempts == item.max_attempts
            assert lease.reservation_id not in {r.id for r in item.reservations}
            item.state = "reserved"
            item.reservation_id = lease.reservation_id
            item.reservations.append(MRes(lease.reservation_id, item.attempts, worker))
            seconds = item.lease_timeout or lease_timeout or self.queue_lease[item.queue]
            self.set_visible(item, self.now + seconds, seq)
            self.held[item.id] = lease

    @rule(
        data=st.data(),
        queues=st.sampled_from([("qa",), ("qa", "qb"), None]),
        n=st.integers(0, 3),
        worker=st.sampled_from(WORKERS),
    )
    def settle_and_lease(self, data, queues, n, worker):
        """A worker's loop in one statement: complete what it finished (stale ones mixed in), lease the next
        batch. The lease sees the rows as they were before the completes (one snapshot) and never takes a
        reserved item named by one of the completes (one statement must not update a row twice); an item
        named only by a stale complete and ready again is as leasable as any other."""
        live = data.draw(st.lists(st.sampled_from(sorted(self.held)), max_size=3, unique=True)) if self.held else []
        extra = data.draw(st.lists(st.sampled_from(self.stale), max_size=2, unique_by=id)) if self.stale else []
        batch = data.draw(st.permutations([self.held[i] for i in live] + extra))
        before = read_snapshot()
        named = frozenset(h.item_id for h in batch if self.items[h.item_id].state == "reserved")
        expected = self.predict_lease(queues, n, exclude=named)
        out = engine.settle_and_lease(
            [(h, {"r": h.item_id}) for h in batch], None if queues is None else list(queues), n, worker
        )
        seq = self.tick()
        assert sorted(h.reservation_id for h in out.stale) == self.stale_completes(extra)
        for item_id in live:
            item = self.items[item_id]
            item.state = "done"
            self.settle(item, "done")
        self.take(before, expected, out.leases, worker, None, seq)
        event(f"settle_and_lease: {len(live)} done, {len(out.leases)} of {n} leased")

    def check_lease_against_rows(self, before: Snapshot, got: list[engine.Lease]) -> None:
        """Model-free: each leased row was due and takeable just before, and no older item of its ordering key
        was open and no other item of the key in flight."""
        for lease in got:
            row = before.items[lease.item_id]
            state, attempts, max_attempts, key, visible = row[2], row[4], row[5], row[8], row[10]
            assert state in OPEN and visible <= 0, f"leased item {row} was not due"
            assert state == "ready" or attempts < max_attempts, f"leased an expired last attempt {row}"
            if key is None:
                continue
            for other in before.items.values():
                if other[0] == row[0] or other[1] != row[1] or other[8] != key or other[2] not in OPEN:
                    continue
                assert other[0] > row[0], f"leased {row[0]} while older item {other[0]} of key {key} is open"
                assert not (other[2] == "reserved" and other[10] > 0), f"{other[0]} of key {key} is in flight"

    # -- settles with a held lease ----------------------------------------------------------------------------

    def draw_held(self, data) -> tuple[MItem, engine.Lease]:
        item_id = data.draw(st.sampled_from(sorted(self.held)), label="held item")
        return self.items[item_id], self.held[item_id]

    @precondition(lambda self: self.held)
    @rule(data=st.data(), worker=st.sampled_from(WORKERS), late=st.sampled_from([None, *SETTLES]))
    def stall_and_take_over(self, data, worker, late):
        """A holder stalls past its deadline, another worker leases from its queue, then the stalled holder
        wakes up and settles late (refused, nothing changed): advance_clock, lease and a stale settle in one step,
        so the fencing story the reservation id exists for comes up often."""
        item, stalled = self.draw_held(data)
        self.advance_clock(max(GRAIN, -(-(item.visible - self.now) // GRAIN) * GRAIN), None, False)
        self.lease((item.queue,), 2, worker, None)
        if late and item.reservation_id != stalled.reservation_id:
            self.try_stale(stalled, late)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data):
        item, lease = self.draw_held(data)
        engine.complete(lease, {"ok": item.id})
        self.tick()
        item.state = "done"
        self.settle(item, "done")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete_many(self, data):
        """A batch of held leases with stale ones mixed in: exactly the stale ones come back (a repeat of a
        complete by the reservation that completed the item is not stale)."""
        live = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=3, unique=True))
        leases = [self.held[i] for i in live]
        extra = data.draw(st.lists(st.sampled_from(self.stale), max_size=2, unique_by=id)) if self.stale else []
        order = data.draw(st.permutations(leases + extra))
        stale = engine.complete_many([(lease, None) for lease in order])
        self.tick()
        assert sorted(s.reservation_id for s in stale) == self.stale_completes(extra)
        for item_id in live:
            item = self.items[item_id]
            item.state = "done"
            self.settle(item, "done")

    @precondition(lambda self: self.held)
    @rule(data=st.data(), retry_in=st.sampled_from([0, GRAIN, 10 * GRAIN]))
    def fail(self, data, retry_in):
        item, lease = self.draw_held(data)
        outcome = engine.fail(lease, "boom", retry_in=retry_in)
        seq = self.tick()
        event(f"fail: {outcome}")
        if item.attempts >= item.max_attempts:
            assert outcome == "dead"
            self.die(item)
            self.settle(item, "dead")
        else:
            assert outcome == "retry"
            item.state = "ready"
            self.set_visible(item, self.now + retry_in, seq)
            item.due, item.due_seq = self.now + retry_in, seq
            self.settle(item, "retry")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def dead(self, data):
        item, lease = self.draw_held(data)
        engine.dead(lease, "poison")
        self.tick()
        self.die(item)
        self.settle(item, "dead")

    @precondition(lambda self: self.held)
    @rule(data=st.data(), seconds=st.sampled_from([GRAIN, 10 * GRAIN]))
    def extend(self, data, seconds):
        item, lease = self.draw_held(data)
        engine.extend(lease, seconds)
        seq = self.tick()
        if item.visible <= self.now:  # the deadline had passed, but nobody took the item: still current
            event("extend: an expired but untaken lease")
            self.current(item).revived = True
        self.set_visible(item, self.now + seconds, seq)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from([0, GRAIN]))
    def release(self, data, delay):
        item, lease = self.draw_held(data)
        engine.release(lease, delay=delay)
        seq = self.tick()
        item.state = "ready"
        item.attempts -= 1
        self.set_visible(item, self.now + delay, seq)
        self.settle(item, "released")

    # -- settles with a stale or forged lease: refused, nothing changes ----------------------------------------

    @precondition(lambda self: self.stale or len(self.held) >= 1 and len(self.items) >= 2)
    @rule(data=st.data(), action=st.sampled_from(SETTLES))
    def stale_settle(self, data, action):
        # stale leases of items reserved again (taken over after expiry, or released and leased) first: the
        # simplest draw is the one a missing fence would let through
        choices = sorted(self.stale, key=lambda h: self.items[h.item_id].state != "reserved")
        for item_id, lease in sorted(self.held.items()) if len(self.items) >= 2 else ():
            other = min(i for i in self.items if i != item_id)
            choices.append(Forged(lease.reservation_id, other, lease.attempt))
        self.try_stale(data.draw(st.sampled_from(choices), label="stale lease"), action)

    def try_stale(self, lease, action: str) -> None:
        before = raw_rows()
        call = {
            "complete": lambda: engine.complete(lease, {"stale": True}),
            "fail": lambda: engine.fail(lease, "late", retry_in=0),
            "dead": lambda: engine.dead(lease, "late"),
            "extend": lambda: engine.extend(lease, GRAIN),
            "release": lambda: engine.release(lease),
        }[action]
        if action == "complete" and not self.stale_completes([lease]):
            call()  # repeated by the reservation that completed the item: succeeds, changes nothing
            event("stale complete: repeated by its own reservation")
        else:
            with pytest.raises(engine.StaleReservation):
                call()
            event(f"stale {action}: {'forged' if isinstance(lease, Forged) else 'stale'}")
        self.tick()
        assert raw_rows() == before, f"a stale {action} of {lease} changed rows"

    # -- time and maintenance ---------------------------------------------------------------------------------

    @rule(
        seconds=st.sampled_from([GRAIN, 2 * GRAIN, 5 * GRAIN, 10 * GRAIN]),
        rescue=st.sampled_from([None, 1000, 1]),
        prune=st.booleans(),
    )
    def advance_clock(self, seconds, rescue, prune):
        """Time passes; maintenance may then rescue expired leases and prune the dedup claims whose window
        ended, as a worker's maintenance loop would."""
        advance_database_clock(seconds)
        self.now += seconds
        if rescue:
            self.rescue(rescue)
        if prune:
            pruned = engine.prune_dedup_claims()
            self.tick()
            gone = [key for key, (_, expires) in self.claims.items() if expires <= self.now]
            for key in gone:
                del self.claims[key]
            assert pruned == len(gone)

    @rule(limit=st.sampled_from([1000, 1000, 1]))
    def rescue_expired(self, limit):
        self.rescue(limit)

    def rescue(self, limit: int) -> None:
        """limit=1 rescues the expired lease with the earliest deadline (one of them when several tie)."""
        expired = [it for it in self.items.values() if it.state == "reserved" and it.visible <= self.now]
        expired.sort(key=lambda it: (it.visible, it.seq, it.id))
        rescued, died = engine.rescue_expired(limit)
        seq = self.tick()
        if limit < len(expired):  # equal deadlines set by one lease: the database may take any of them
            tied = [it.id for it in expired if (it.visible, it.seq) == (expired[0].visible, expired[0].seq)]
            snap = read_snapshot()
            rescued_ids = {i for i in tied if snap.items[i][2] != "reserved"}
            assert len(rescued_ids) == limit, f"rescue of {limit} took {rescued_ids} of the earliest {tied}"
            expired = [it for it in expired if it.id in rescued_ids]
            event("rescue: limited")
        expect = [0, 0]
        for item in expired:
            # Back in line where it stood: due as of its run_at, unless that is still ahead (dying ones too; the
            # row's visible_at then no longer matters).
            if item.due <= self.now:
                self.set_visible(item, item.due, item.due_seq)
            else:
                self.set_visible(item, self.now, seq)
            if item.attempts >= item.max_attempts:
                self.die(item)
                expect[1] += 1
            else:
                item.state = "ready"
                expect[0] += 1
            self.settle(item, "expired")
        assert [rescued, died] == expect
        event(f"rescue: {'some' if rescued or died else 'none'}")

    @rule()
    def lease_one(self):
        """The simplest step, so the one hypothesis favours: w1 leases one item from any queue."""
        self.lease(None, 1, "w1", None)

    # -- services ---------------------------------------------------------------------------------------------

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def requeue(self, data):
        ids = self.pick(data, ("dead", "cancelled"))
        changed = services.requeue_items(ids, actor="prop")
        seq = self.tick()
        expect = 0
        for item_id in ids:
            item = self.items[item_id]
            if item.state in ("dead", "cancelled"):
                expect += 1
                item.state, item.attempts, item.open_dead_letters = "ready", 0, 0
                item.debounce_key = None  # a requeued item runs as itself
                item.requeue_mark = len(item.reservations)
                self.set_visible(item, self.now, seq)
                item.due, item.due_seq = self.now, seq
        assert changed == expect
        event(f"requeue: {changed} changed")

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def retry_now(self, data):
        ids = self.pick(data, ("ready",))
        changed = services.retry_now(ids)
        seq = self.tick()
        due = [i for i in ids if self.items[i].state == "ready" and self.items[i].visible > self.now]
        for item_id in due:
            self.set_visible(self.items[item_id], self.now, seq)
            self.items[item_id].due, self.items[item_id].due_seq = self.now, seq
        assert changed == len(due)

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def cancel(self, data):
        ids = self.pick(data, OPEN)
        changed = services.cancel_items(ids, actor="prop")
        self.tick()
        expect = 0
        for item_id in ids:
            item = self.items[item_id]
            if item.state in OPEN:
                expect += 1
                if item.state == "reserved":
                    event("cancel: a reserved item")
                    self.settle(item, "cancelled")
                item.state = "cancelled"
        assert changed == expect

    # -- invariants -------------------------------------------------------------------------------------------

    @invariant()
    def database_matches_model_and_invariants_hold(self):
        snap = read_snapshot()
        self.check_rows_alone(snap)
        self.check_ordering(snap)
        self.check_model(snap)

    def check_rows_alone(self, snap: Snapshot) -> None:
        """Invariants that need no model: read off the rows."""
        by_item: dict[int, list[tuple]] = {}
        for res in snap.reservations:
            assert res[1] in snap.items, f"reservation {res} of a vanished item"
            by_item.setdefault(res[1], []).append(res)
        open_letters: dict[int, int] = {}
        for letter in snap.dead_letters:
            open_letters[letter[1]] = open_letters.get(letter[1], 0) + letter[2]
        for item_id, row in snap.items.items():
            state, attempts, max_attempts, current, visible = row[2], row[4], row[5], row[9], row[10]
            history = by_item.get(item_id, [])
            unsettled = [r for r in history if r[4] is None]
            if state == "reserved":
                assert [r[0] for r in unsettled] == [current], f"item {item_id}: open reservations {unsettled}"
                res = unsettled[0]
                assert res[2] == attempts, f"item {item_id}: current attempt {res[2]} != attempts {attempts}"
                assert abs(res[5] - visible) < 1e-3, f"item {item_id}: lease deadline and visible_at differ"
            else:
                assert not unsettled, f"item {item_id} is {state} with open reservations {unsettled}"
            assert 0 <= attempts <= max_attempts, f"item {item_id}: attempts {attempts} of {max_attempts}"
            assert state != "ready" or attempts < max_attempts, f"ready item {item_id} has no attempt left"
            assert current == (history[-1][0] if history else None), f"item {item_id} points at {current}"
            assert open_letters.get(item_id, 0) == (state == "dead"), f"item {item_id} ({state}): dead letters"
        # dedup: items of one (queue, key) were created a whole window apart, and a live claim names the newest
        keyed: dict[tuple[str, str], list[tuple]] = {}
        for row in snap.items.values():
            if row[7] is not None:
                keyed.setdefault((row[1], row[7]), []).append(row)
        for key, rows in keyed.items():
            for older, younger in zip(rows, rows[1:], strict=False):
                assert younger[11] - older[11] >= 2 * GRAIN - 1, f"dedup {key}: {older[0]}, {younger[0]} too close"
            claim = snap.claims.get(key)
            if claim is not None and claim[3] > 0:
                assert claim[2] == rows[-1][0], f"live claim {claim} does not name the newest item of {key}"

    def check_ordering(self, snap: Snapshot) -> None:
        """One item of an ordering key in flight (reserved, lease not expired). The exception: a lease that
        expired untaken and was then extended by its holder while an older item of the key (requeued by an
        admin after the younger one went out) was leased; extend and heartbeats do not look at other items."""
        in_flight: dict[tuple[str, str], list[int]] = {}
        for row in snap.items.values():
            if row[8] is not None and row[2] == "reserved" and row[10] > 0:
                in_flight.setdefault((row[1], row[8]), []).append(row[0])
        for key, ids in in_flight.items():
            fresh = [i for i in ids if not self.current(self.items[i]).revived]
            assert len(fresh) <= 1, f"ordering key {key}: {ids} in flight at once"
            if len(ids) > 1:
                event("ordering: an extended expired lease overlaps a newer one")

    def check_model(self, snap: Snapshot) -> None:
        """Every row as the model predicts: nothing appears, vanishes or changes state unexpectedly."""
        assert sorted(snap.items) == sorted(self.items), "items appeared or vanished"
        assert len(snap.items) == self.enqueued
        reservations = {r[0]: r for r in snap.reservations}
        assert len(reservations) == sum(len(it.reservations) for it in self.items.values())
        letters: dict[int, list[tuple]] = {}
        for letter in snap.dead_letters:
            letters.setdefault(letter[1], []).append(letter)
        for item_id, item in self.items.items():
            row = snap.items[item_id]
            got = (row[1], row[2], row[3], row[4], row[5], row[7], row[8], row[9])
            want = (
                item.queue,
                item.state,
                item.priority,
                item.attempts,
                item.max_attempts,
                item.dedup_key,
                item.ordering_key,
                item.reservation_id,
            )
            assert got == want, f"item {item_id}: database {got}, model {want}"
            created = item.created - self.now
            assert created - GRAIN < row[11] <= created + 1e-3, f"item {item_id}: created_at {row[11]} vs {created}"
            relative = item.visible - self.now  # the row was written at most a few seconds ago, never a GRAIN
            assert relative - GRAIN < row[10] <= relative + 1e-3, f"item {item_id}: visible_at {row[10]} vs {relative}"
            for res in item.reservations:
                got_res = reservations[res.id][1:5]
                assert got_res == (item_id, res.attempt, res.worker, res.outcome), f"reservation {got_res} vs {res}"
            # every attempt since the last requeue is a reservation that was not released (handed back unspent)
            spent = [reservations[r.id] for r in item.reservations[item.requeue_mark :]]
            assert row[4] == sum(r[4] != "released" for r in spent), f"item {item_id}: attempts vs history"
            mine = letters.get(item_id, [])
            assert (len(mine), sum(x[2] for x in mine)) == (item.dead_letters, item.open_dead_letters)
        for key, (owner, expires) in self.claims.items():
            claim = snap.claims.get(key)
            assert claim is not None and claim[2] == owner, f"dedup claim {key}: {claim} vs {owner}"
            assert (expires - self.now) - GRAIN < claim[3] <= expires - self.now + 1e-3
        assert len(snap.claims) == len(self.claims)
        states = {}
        for row in snap.items.values():
            states[row[2]] = states.get(row[2], 0) + 1
        assert sum(states.values()) == self.enqueued and set(states) <= set(STATES), f"states {states}"


@pytest.mark.django_db(transaction=True)
def test_engine_state_machine(pytestconfig):
    """Engine calls commit (transactional_db); each example empties the queue tables itself. Failing examples
    are kept in .pytest_cache (ignored by git) and replayed first on the next run."""
    cache = getattr(pytestconfig, "cache", None)  # absent under -p no:cacheprovider
    db = DirectoryBasedExampleDatabase(str(cache.mkdir("hypothesis-engine"))) if cache else None
    with override_settings(JOBSITE=DEFAULTS):
        run_state_machine_as_test(
            EngineMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                database=db,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            ),
        )
