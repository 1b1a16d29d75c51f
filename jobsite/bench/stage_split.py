"""Where the start latency goes, stage by stage: the workers' stage times (JOBSITE["STAGE_TIMES"],
queue_app/stages.py) joined with the database's times of each probe (its created_at, the handler's first
statement's executed_at: clock_timestamp(), the same host's clock) and the bench's own (the enqueue's return).

The stages follow one another, so for each probe they add up to its total, created_at to executed_at:
- insert: created_at (its transaction's start) to the enqueue's insert returned in the bench, when the probe was
  enqueued in a transaction block (measure_latency's `commit_apart`); otherwise part of `commit`;
- commit: to the enqueue's return in the bench, its COMMIT made durable (the WAL flush: synchronous_commit on) and
  the answer's trip back;
- notify: that return to the notification drained by the worker's loop (NOTIFY's delivery, the loop's wake-up
  from select; a few tens of microseconds below zero when the notification won the race with the answer), for
  items leased on their wake-up;
- to_send: to the settle-and-lease statement being sent (from the wake-up; from the enqueue's return for items
  leased otherwise: behind a lease in flight, a gathering of freed slots, a follower's turn, a poll);
- statement: the settle-and-lease round trip (and what it asked for and got, where it ran: `leases`);
- hand_off: its result to this item's job handed to the pool (the loop taking the result, the items ahead of it);
- pickup: the job handed over to a thread or child taking it (a queue's wake-up; the process pool's pipe);
- preamble: taken to the handler's first line (the connection's check, run_job's preamble);
- first_query: the first line to the handler's first statement executing (its trip to the server).
"""

from collections import Counter
from pathlib import Path

from .report import percentile

STAGES = ("insert", "commit", "notify", "to_send", "statement", "hand_off", "pickup", "preamble", "first_query")


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
    """Per stage, the milliseconds of each probe that has all its times; the totals of those probes; and the
    leases that took them (`leases`: (path, asked, got) -> probes)."""

    def __init__(self) -> None:
        self.stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
        self.totals: list[float] = []
        self.leases: Counter = Counter()

    def add(self, stage: str, ms: float) -> None:
        self.stages[stage].append(ms)


def split(rows: list[tuple[int, float, float, float, float | None]], path: Path) -> Split:
    """`rows`: (reservation id, created_at, executed_at, the enqueue's return, its insert's return or None) of each
    probe's run, epoch seconds."""
    stamps = read_stage_file(path)
    out = Split()
    for reservation_id, created, executed, returned, inserted in rows:
        lease = stamps["L"].get(reservation_id)
        times = [stamps[kind].get(reservation_id) for kind in "SPF"]
        if lease is None or None in times:
            continue
        woken, sent, leased, asked, got, where = lease
        submitted, picked, first = (t[0] for t in times)
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
        out.add("first_query", (executed - first) * 1000)
        out.totals.append((executed - created) * 1000)
        out.leases[(where, asked, got)] += 1
    return out


def describe(parts: Split) -> str:
    """ "commit p50 0.91 / p99 2.10; notify ... (180 of 200); ...; sum of p50s 3.2, total p50 3.3" for the stages
    measured."""
    counted = len(parts.totals)
    said = []
    for stage in STAGES:
        values = parts.stages[stage]
        if not values:
            continue
        share = "" if len(values) == counted else f" ({len(values)} of {counted})"
        said.append(f"{stage} p50 {percentile(values, 0.5):.2f} / p99 {percentile(values, 0.99):.2f}{share}")
    if not counted:
        return "no stage times"
    means = sum(sum(v) / counted for v in parts.stages.values())
    said.append(f"sum of the means {means:.2f} = total mean {sum(parts.totals) / counted:.2f}")
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
