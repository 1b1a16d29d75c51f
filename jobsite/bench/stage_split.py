"""Where the start latency goes, stage by stage: the workers' stage times (JOBSITE["STAGE_TIMES"],
queue_app/worker/stages.py) joined with the database's times of each probe (its created_at, the handler's first
statement's executed_at: clock_timestamp(), the same host's clock).

Stages, from the enqueue's statement to the handler's first statement (`enqueue` overlaps `notify`: it ends when the
enqueue's call returned to the bench, its commit made durable and the answer's trip back):
- enqueue: created_at (its statement's start) to the enqueue call's return;
- notify: created_at to the notification's arrival in the worker's loop (the enqueue's commit, NOTIFY's delivery,
  the wake-up from select), for items leased on a wake-up;
- to_send: to the settle-and-lease statement being sent (from the wake-up; from created_at for items leased
  otherwise: behind a lease in flight, a gathering of freed slots, a poll);
- statement: the settle-and-lease round trip;
- hand_off: its result to the hand-over of its batch to the pool begun (the loop taking the result, the
  at-most-once record and the lease renewal when there are any);
- pickup: the hand-over begun to a thread or child taking the job (the submit, a queue's wake-up, a pipe);
- handler: taken to the handler's first statement (run_job's preamble, the connection's check, the statement's
  trip to the server).
"""

from pathlib import Path

from .report import percentile

STAGES = ("enqueue", "notify", "to_send", "statement", "hand_off", "pickup", "handler")


def read_stage_file(path: Path) -> tuple[dict[int, tuple[float, float, float, float]], dict[int, float]]:
    leases: dict[int, tuple[float, float, float, float]] = {}
    picks: dict[int, float] = {}
    if not path.exists():
        return leases, picks
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "L":
            leases[int(parts[1])] = tuple(float(p) for p in parts[2:])  # type: ignore[assignment]
        elif len(parts) == 3 and parts[0] == "P":
            picks[int(parts[1])] = float(parts[2])
    return leases, picks


def split(rows: list[tuple[int, float, float, float]], path: Path) -> dict[str, list[float]]:
    """Per stage, the milliseconds of each probe that has all its times. `rows`: (reservation id, created_at,
    executed_at, the enqueue's return) of each probe's run, epoch seconds."""
    leases, picks = read_stage_file(path)
    out: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for reservation_id, created, executed, returned in rows:
        times = leases.get(reservation_id)
        picked = picks.get(reservation_id)
        if times is None or picked is None:
            continue
        woken, sent, leased, submitted = times
        out["enqueue"].append((returned - created) * 1000)
        if woken and created <= woken <= sent:
            out["notify"].append((woken - created) * 1000)
            out["to_send"].append((sent - woken) * 1000)
        else:
            out["to_send"].append((sent - created) * 1000)
        out["statement"].append((leased - sent) * 1000)
        out["hand_off"].append((submitted - leased) * 1000)
        out["pickup"].append((picked - submitted) * 1000)
        out["handler"].append((executed - picked) * 1000)
    return out


def describe(parts: dict[str, list[float]]) -> str:
    """ "notify p50 0.41 / p99 0.90 (180 of 200), to_send ..." for the stages measured."""
    counted = max((len(v) for v in parts.values()), default=0)
    said = []
    for stage in STAGES:
        values = parts[stage]
        if not values:
            continue
        share = "" if len(values) == counted else f" ({len(values)} of {counted})"
        said.append(f"{stage} p50 {percentile(values, 0.5):.2f} / p99 {percentile(values, 0.99):.2f}{share}")
    return "; ".join(said) if said else "no stage times"


def detail(parts: dict[str, list[float]]) -> dict[str, float]:
    return {
        f"stage_{stage}_{name}_ms": round(percentile(values, q), 3)
        for stage, values in parts.items()
        if values
        for name, q in (("p50", 0.5), ("p99", 0.99))
    }
