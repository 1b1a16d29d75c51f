"""Where the start latency goes, stage by stage: the workers' stage times (JOBSITE["STAGE_TIMES"],
queue_app/stages.py) joined with the database's times of each probe (its created_at, its lease's reserved_at, the
handler's first statement's executed_at: clock_timestamp(), the same host's clock) and the bench's own (the clock
read just before the enqueue call, the enqueue's return).

The start is the handler's first line, as for every peer beside it (bench/peers/probe.py: the clock read just
before the enqueue call to the handler's first line). The stages follow one another, so for each probe they add up
to its total, that call to that first line:
- call: the enqueue called to its transaction started on the server (created_at: the call's own work in Python and
  the first statement's trip);
- insert: created_at to the enqueue's insert returned in the bench, when the probe was enqueued in a transaction
  block (measure_latency's `commit_apart`); otherwise part of `commit`;
- commit: to the enqueue's return in the bench, its COMMIT made durable (the WAL flush: synchronous_commit on) and
  the answer's trip back;
- notify: that return to the notification drained by the worker's loop (NOTIFY's delivery, the loop's wake-up
  from select; a few tens of microseconds below zero when the notification won the race with the answer), for
  items leased on their wake-up;
- to_send: to the settle-and-lease statement being sent (from the wake-up; from the enqueue's return for items
  leased otherwise: behind a lease in flight, a gathering of freed slots, a follower's turn, a poll);
- statement: the settle-and-lease round trip (and what it asked for and got, where it ran: `leases`); for an item
  handed off (engine/handoff.py: its enqueue leased it), `to_send` and `statement` are 0 and `notify` is the
  notification carrying its lease;
- hand_off: its result to this item's job handed to the pool (the loop taking the result, the items ahead of it);
- pickup: the job handed over to a thread or child taking it (a queue's wake-up; the process pool's pipe);
- preamble: taken to the handler's first line (the connection's check, run_job's preamble).
After the start, apart from the total: first_query, the first line to the handler's first statement executing
(its trip to the server, and its parse and plan on a backend that may not have run it yet: the handler's own work,
which the figures measured to that statement until 2026-12-04 counted and no peer's does).
"""

from collections import Counter
from pathlib import Path

from .report import percentile

STAGES = ("call", "insert", "commit", "notify", "to_send", "statement", "hand_off", "pickup", "preamble")
AFTER_START = "first_query"  # measured, apart from the total


def read_stage_file(path: Path) -> dict[str, dict[int, tuple]]:
    """The stamps by kind (L, S, P, F) and reservation id."""
    stamps: dict[str, dict[int, tuple]] = {"L": {}, "S": {}, "P": {}, "F": {}}
    if not path.exists():
        return stamps
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 8 and parts[0] == "L":
            stamps["L"][int(parts[1])] = (*map(float, parts[2:5]), int(parts[5]), int(parts[6]), parts[7])
        elif len(parts) == 3 and parts[0] in "SPF":
            stamps[parts[0]][int(parts[1])] = (float(parts[2]),)
    return stamps


class Split:
    """Per stage, the milliseconds of each probe that has all its times; the totals of those probes (the enqueue
    called to the handler's first line), their parts to the lease (the call to reserved_at) and after it; the
    handler's first statement after its first line (AFTER_START); and the leases that took them (`leases`:
    (path, asked, got) -> probes)."""

    def __init__(self) -> None:
        self.stages: dict[str, list[float]] = {stage: [] for stage in (*STAGES, AFTER_START)}
        self.totals: list[float] = []
        self.to_lease: list[float] = []
        self.leases: Counter = Counter()

    def add(self, stage: str, ms: float) -> None:
        self.stages[stage].append(ms)

    def lease_to_start(self) -> list[float]:
        return [total - leased for total, leased in zip(self.totals, self.to_lease, strict=True)]


Probe = tuple[int, float, float, float, float, float, float | None]


def split(rows: list[Probe], path: Path) -> Split:
    """`rows`: (reservation id, the enqueue called, created_at, reserved_at, executed_at, the enqueue's return, its
    insert's return or None) of each probe's run, epoch seconds. A probe the workers did not stamp at every stage
    is left out of all of it."""
    stamps = read_stage_file(path)
    out = Split()
    for reservation_id, called, created, reserved, executed, returned, inserted in rows:
        lease = stamps["L"].get(reservation_id)
        times = [stamps[kind].get(reservation_id) for kind in "SPF"]
        if lease is None or None in times:
            continue
        woken, sent, leased, asked, got, where = lease
        submitted, picked, first = (t[0] for t in times)
        out.add("call", (created - called) * 1000)
        if inserted is not None:
            out.add("insert", (inserted - created) * 1000)
        out.add("commit", (returned - (created if inserted is None else inserted)) * 1000)
        if woken and created <= woken <= sent:
            out.add("notify", (woken - returned) * 1000)
            out.add("to_send", (sent - woken) * 1000)
        else:
            out.add("to_send", (sent - returned) * 1000)
        out.add("statement", (leased - sent) * 1000)
        out.add("hand_off", (submitted - leased) * 1000)
        out.add("pickup", (picked - submitted) * 1000)
        out.add("preamble", (first - picked) * 1000)
        out.add(AFTER_START, (executed - first) * 1000)
        out.totals.append((first - called) * 1000)
        out.to_lease.append((reserved - called) * 1000)
        out.leases[(where, asked, got)] += 1
    return out


def _p50_p99(name: str, values: list[float], share: str = "") -> str:
    return f"{name} p50 {percentile(values, 0.5):.2f} / p99 {percentile(values, 0.99):.2f}{share}"


def describe(parts: Split) -> str:
    """ "call p50 0.12 / p99 0.20; commit ... ; notify ... (180 of 200); ...; sum of the means 3.2 = total mean
    3.2; then first_query p50 0.5 / p99 1.6" for the stages measured."""
    counted = len(parts.totals)
    if not counted:
        return "no stage times"
    said = []
    for stage in STAGES:
        values = parts.stages[stage]
        if values:
            said.append(_p50_p99(stage, values, "" if len(values) == counted else f" ({len(values)} of {counted})"))
    means = sum(sum(parts.stages[stage]) / counted for stage in STAGES)
    said.append(f"sum of the means {means:.2f} = total mean {sum(parts.totals) / counted:.2f}")
    said.append(f"then {_p50_p99(AFTER_START, parts.stages[AFTER_START])} (the handler's own, not in the total)")
    return "; ".join(said)


def describe_leases(parts: Split) -> str:
    """ "loop asked 532 got 1: 40; thread asked 532 got 7: 3": the leases that took the probes."""
    return "; ".join(f"{where} asked {asked} got {got}: {n}" for (where, asked, got), n in sorted(parts.leases.items()))


def detail(parts: Split) -> dict[str, object]:
    out: dict[str, object] = {
        f"stage_{stage}_{name}_ms": round(percentile(values, q), 3)
        for stage, values in parts.stages.items()
        if values
        for name, q in (("p50", 0.5), ("p99", 0.99))
    }
    counted = len(parts.totals)
    if counted:
        out.update(
            {f"stage_{stage}_mean_ms": round(sum(v) / counted, 3) for stage, v in parts.stages.items() if v},
            stage_total_mean_ms=round(sum(parts.totals) / counted, 3),
            stage_probes=counted,
            stage_leases={f"{w} asked {a} got {g}": n for (w, a, g), n in sorted(parts.leases.items())},
        )
    return out
