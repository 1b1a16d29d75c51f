"""The fault schedule: which faults, in what order, at what share of the work done.

Faults fire by progress (share of the items settled), not by the clock, so they land on work in flight
whatever the machine's speed; two faults are at least `min_gap` seconds apart (a replacement worker gets
going, a reconnect settles) and at most one outage (restart or cut) is under way at a time. The order is
shuffled by the seed, except that the first fault is a kill.
"""

import random
from dataclasses import dataclass, field

FIRST, LAST = 0.05, 0.70  # the faults fire between these shares of the work done


@dataclass(frozen=True)
class Fault:
    kind: str  # kill, kill_amo (a worker running at-most-once handlers), kill_handoff, sigterm, restart, cut
    at: float  # share of the items settled when it may fire
    seconds: float = 0.0  # cut: how long new connections are refused


@dataclass
class Fired:
    """What happened when a fault fired, for the report and the checks."""

    kind: str
    t: float  # seconds since the run's workers started
    progress: float
    worker_id: str = ""
    pid: int = 0
    held: int = 0  # kill: reservations the worker held (outcome still open) when it died
    amo_running: list[int] = field(default_factory=list)  # kill_amo: at-most-once items it was running
    seconds: float = 0.0  # restart: how long it took; cut: how long connections were refused
    connections: int = 0  # cut: live connections reset
    detail: dict = field(default_factory=dict)


def schedule(
    rng: random.Random,
    *,
    kills: int,
    sigterms: int,
    restarts: int,
    cuts: int,
    cut_seconds: float,
    amo_kills: int = 0,
    handoff_kills: int = 0,
):
    kinds = ["sigterm"] * sigterms + ["restart"] * restarts + ["cut"] * cuts + ["kill"] * max(0, kills - 1)
    kinds += ["kill_amo"] * amo_kills + ["kill_handoff"] * handoff_kills
    rng.shuffle(kinds)
    if kills:
        kinds.insert(0, "kill")
    if not kinds:
        return []
    step = (LAST - FIRST) / max(1, len(kinds) - 1)
    faults = []
    for n, kind in enumerate(kinds):
        jitter = rng.uniform(-0.3, 0.3) * step if 0 < n < len(kinds) - 1 else 0.0
        faults.append(Fault(kind, round(FIRST + n * step + jitter, 4), cut_seconds if kind == "cut" else 0.0))
    return faults
