"""What a chaos run plants: its sizes, and the items (probes in three delivery modes, chunked probes in two,
ordering keys, group keys on a queue under flow control, poison). Debounced enqueues are fed during the faults
(debounce.py).

Every item is a probe (queue_app/tasks.py), so every run of its handler leaves an ExecutionLog row and its
effect a ProbeEffect row, except the poison, which the worker must dead-letter: an unknown task, and probes
asked to fail with a single attempt. Which ids are poison, and why each must die, is recorded here so the
checks can demand exactly those dead letters.
"""

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from queue_app import engine
from queue_app.engine.sql import DeadReason
from queue_app.registry import get_task

QUEUE = "chaos"  # unordered items
FIFO_QUEUE = "chaos_fifo"  # items with ordering keys
FLOW_QUEUE = "chaos_flow"  # items with group keys, on a queue with a rate limit and a group limit
HANDOFF_QUEUE = "chaos_handoff"  # items fed one at a time during the faults, handed to an idle worker (handoff.py)
QUEUES = (QUEUE, FIFO_QUEUE, FLOW_QUEUE, HANDOFF_QUEUE)
# The flow queue's options (queue_app/flow.py): at most FLOW_RATE[0] leases per FLOW_RATE[1] seconds, at most
# FLOW_GROUP_LIMIT items of a group key in flight, FLOW_KEYS keys leased in turn.
FLOW_RATE = (20, 1)  # binds: the flow queue's items take several windows
FLOW_GROUP_LIMIT = 2
FLOW_KEYS = 4
QUEUE_LEASE = 20.0  # seconds; the probes' floor is 7 (hard timeout 5 + margin 2)
WORKER_LOST_AFTER = 15.0  # a killed worker's leases come back this long after its last heartbeat
ARCHIVE_AFTER = 2.0  # seconds before the workers move a finished item into the partitioned history

MODES = {
    "at_least_once": "queue_app.probe",
    "at_most_once": "queue_app.probe_at_most_once",
    "transactional": "queue_app.probe_transactional",
}
MODE_SHARE = {"at_least_once": 0.4, "at_most_once": 0.3, "transactional": 0.3}
# Chunked probes (a handler call takes up to 20 items, each settled on its own): a share of the unordered batches
# of the modes a chunk may have (a chunked task is never transactional).
CHUNK_MODES = {"at_least_once": "queue_app.probe_chunk", "at_most_once": "queue_app.probe_chunk_at_most_once"}
CHUNK_SHARE = 0.15
UNKNOWN_TASK = "chaos.no_such_task"

LEASE_EXPIRED = "lease expired on the last attempt"  # a poison probe whose worker was killed while it ran
AMO_STOPPED = DeadReason.AT_MOST_ONCE_STOPPED  # an at-most-once one killed while its handler ran
AMO_KILL_ITEMS, AMO_KILL_SLEEP = 24, 1.0  # per kill_amo fault: at-most-once items whose handlers sleep
# Poison kinds -> (task, queue, payload, the dead-letter reasons that are right for it).
POISON = {
    "unknown_task": (UNKNOWN_TASK, QUEUE, {}, (f"unknown task: {UNKNOWN_TASK}", LEASE_EXPIRED)),
    "fail_at_least_once": (MODES["at_least_once"], QUEUE, {"fail": True}, ("max attempts exhausted", LEASE_EXPIRED)),
    "fail_at_most_once": (
        MODES["at_most_once"],
        QUEUE,
        {"fail": True},
        ("at-most-once attempt failed (not retried)", LEASE_EXPIRED, AMO_STOPPED),
    ),
    "fail_transactional_ordered": (
        MODES["transactional"],
        FIFO_QUEUE,
        {"fail": True},
        ("max attempts exhausted", LEASE_EXPIRED),
    ),
}


@dataclass(frozen=True)
class Sizes:
    items: int  # work items, poison included
    workers: int  # worker processes kept running during the faults
    concurrency: int  # handler slots per worker
    kills: int  # kill -9 of a random worker
    sigterms: int  # SIGTERM of a random worker
    restarts: int  # PostgreSQL restarts
    cuts: int  # connection losses
    cut_seconds: float  # how long each connection loss refuses new connections
    keys: int  # ordering keys
    ordered_share: float  # share of the items that carry an ordering key
    flow_share: float  # share of the items on the flow-controlled queue (with group keys)
    poison: int  # poison items planted
    sleep_share: float  # share of the items whose handler sleeps (so kills land on handlers mid-run)
    sleep_seconds: float
    min_gap: float  # seconds between two faults at least
    deadline: float  # seconds the whole run may take before it gives up (and fails)
    amo_kills: int = 1  # kill -9 of a worker while it runs at-most-once handlers (their dead letters must say so)
    debounce_keys: int = 4  # debounce keys fed during the faults (debounce.py)
    debounce_per_key: int = 40  # enqueues per debounce key
    handoff_items: int = 60  # plain enqueues fed during the faults into the hand-off worker's queue (handoff.py)
    handoff_kills: int = 1  # kill -9 of the hand-off worker (mostly mid-run of a handed item)

    def scaled(self, items: int | None = None, workers: int | None = None) -> "Sizes":
        sizes = self if items is None else replace(self, items=items, poison=max(4, min(self.poison, items // 50)))
        return sizes if workers is None else replace(sizes, workers=workers)


QUICK = Sizes(
    items=3_000, workers=3, concurrency=4, kills=2, sigterms=1, restarts=1, cuts=1, cut_seconds=2.0, keys=6,
    ordered_share=0.08, flow_share=0.05, poison=12, sleep_share=0.25, sleep_seconds=0.3, min_gap=4.0, deadline=600.0,
)  # fmt: skip
FULL = Sizes(
    items=100_000, workers=3, concurrency=4, kills=8, sigterms=3, restarts=1, cuts=2, cut_seconds=3.0, keys=20,
    ordered_share=0.05, flow_share=0.02, poison=100, sleep_share=0.02, sleep_seconds=0.2, min_gap=5.0, deadline=3600.0,
    debounce_keys=8, debounce_per_key=200, handoff_items=400, handoff_kills=2,
)  # fmt: skip


@dataclass
class Planted:
    """The ids a run enqueued, by what they are."""

    by_mode: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    by_key: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    poison: dict[int, str] = field(default_factory=dict)  # id -> poison kind
    flow: list[int] = field(default_factory=list)  # the items on the flow-controlled queue
    chunked: list[int] = field(default_factory=list)  # the items of chunked probes

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.by_mode.values()) + len(self.poison)

    def poison_reasons(self) -> dict[int, tuple[str, ...]]:
        return {item: POISON[kind][3] for item, kind in self.poison.items()}


@dataclass(frozen=True)
class Batch:
    task: str
    queue: str
    payloads: list[dict]
    ordering_key: str | None = None
    max_attempts: int | None = None
    mode: str | None = None  # None: poison
    poison: str | None = None
    group_key: str | None = None


def _work_payloads(rng: random.Random, n: int, sizes: Sizes) -> list[dict]:
    return [{"sleep": sizes.sleep_seconds} if rng.random() < sizes.sleep_share else {} for _ in range(n)]


def _mode(rng: random.Random) -> str:
    return rng.choices(list(MODE_SHARE), weights=list(MODE_SHARE.values()))[0]


def plan(sizes: Sizes, rng: random.Random) -> list[Batch]:
    """Batches in enqueue order: unordered chunks of one mode each, ordered runs of 1-8 items per key, chunks of
    one group key each on the flow queue, the poison sprinkled between them."""
    work = sizes.items - sizes.poison - sizes.amo_kills * AMO_KILL_ITEMS
    ordered = int(work * sizes.ordered_share) if sizes.keys else 0
    flow_left = int(work * sizes.flow_share)
    flow: list[Batch] = []
    while flow_left > 0:
        n = min(flow_left, rng.randint(5, 40))
        mode, key = _mode(rng), f"tenant-{rng.randrange(FLOW_KEYS)}"
        flow.append(Batch(MODES[mode], FLOW_QUEUE, _work_payloads(rng, n, sizes), mode=mode, group_key=key))
        flow_left -= n
    unordered: list[Batch] = []
    left = work - ordered - int(work * sizes.flow_share)
    while left > 0:
        n = min(left, rng.randint(50, 300))
        mode = _mode(rng)
        task = CHUNK_MODES[mode] if mode in CHUNK_MODES and rng.random() < CHUNK_SHARE else MODES[mode]
        unordered.append(Batch(task, QUEUE, _work_payloads(rng, n, sizes), mode=mode))
        left -= n
    for mode, task in CHUNK_MODES.items():  # at least one chunked batch of each such mode, whatever the draw
        of_mode = [n for n, b in enumerate(unordered) if b.mode == mode]
        if of_mode and not any(unordered[n].task == task for n in of_mode):
            unordered[of_mode[0]] = replace(unordered[of_mode[0]], task=task)
    fifo: list[Batch] = []
    per_key = {f"key-{k:02d}": ordered // sizes.keys + (k < ordered % sizes.keys) for k in range(sizes.keys)}
    while any(per_key.values()):
        for key, left in per_key.items():
            if left:
                n = min(left, rng.randint(1, 8))
                mode = _mode(rng)
                fifo.append(Batch(MODES[mode], FIFO_QUEUE, _work_payloads(rng, n, sizes), key, mode=mode))
                per_key[key] -= n
    keys = sorted(per_key)
    poison = []
    for n in range(sizes.poison):
        kind = list(POISON)[n % len(POISON)]
        task, queue, payload, _ = POISON[kind]
        key = keys[n % len(keys)] if queue == FIFO_QUEUE and keys else None
        poison.append(Batch(task, queue if key else QUEUE, [dict(payload)], key, max_attempts=1, poison=kind))
    # Slow at-most-once items, so that a worker running at-most-once handlers can be found and killed mid-run.
    slow_amo = [
        Batch(MODES["at_most_once"], QUEUE, [{"sleep": AMO_KILL_SLEEP}] * AMO_KILL_ITEMS, mode="at_most_once")
        for _ in range(sizes.amo_kills)
    ]
    batches = unordered + fifo + flow + poison + slow_amo
    rng.shuffle(batches)
    # Shuffling keeps each key's batches in some order; ids follow enqueue order, which is all FIFO needs.
    return batches


def enqueue(batches: list[Batch], using: str, progress: Callable[[int], None] | None = None) -> Planted:
    planted = Planted()
    done = 0
    for batch in batches:
        options = {"queue": batch.queue, "ordering_key": batch.ordering_key, "using": using}
        if batch.group_key is not None:
            options["group_key"] = batch.group_key
        if batch.max_attempts is not None:
            options["max_attempts"] = batch.max_attempts
        if batch.task == UNKNOWN_TASK:
            ids = engine.enqueue_many(batch.task, batch.payloads, **options)
        else:
            ids = get_task(batch.task).enqueue_many(batch.payloads, **options)
        if batch.poison:
            planted.poison.update(dict.fromkeys(ids, batch.poison))
        else:
            planted.by_mode[batch.mode].extend(ids)
        if batch.ordering_key:
            planted.by_key[batch.ordering_key].extend(ids)
        if batch.group_key:
            planted.flow.extend(ids)
        if batch.task in CHUNK_MODES.values():
            planted.chunked.extend(ids)
        done += len(ids)
        if progress is not None:
            progress(done)
    return planted
