"""The invariants a chaos run must keep, judged from the rows it left (history.py), each a named pass/fail
with figures and the first few counter-examples.

Vocabulary:
- a *run* is one ExecutionLog row (one call of a probe's handler); a *duplicate* is every run of an item
  after its first.
- a run is *explained* when the reservation it ran under ended without being settled for a reason the run
  planted: its worker was killed (-9) and the lease expired (`killed`), or its handler failed on a database
  error during an outage and the item was retried (`db-error`), or its worker was SIGTERMed and handed the
  item back at the end of its grace period (`sigterm-grace`). Anything else (a second run after a `done`
  reservation, an expired lease of a live worker, two runs under one reservation) is unexplained.
- an at-most-once *casualty* is an at-most-once item whose single attempt a fault took: killed before its start
  (lease expired: a dead letter `lease expired on the last attempt`, never ran), killed (or cut off past its
  lease by an outage) while its handler ran (a dead letter `worker stopped during an at-most-once run`, run at
  most once), or its handler failed on a database error (a dead letter). At-most-once promises exactly that;
  each is counted. An at-most-once item done without a run is a breach.
"""

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from queue_app.engine.sql import DeadReason

from .history import History, Res, Run

# How long after a worker's kill -9 its server sessions may still act for it: the server ends a session once it
# reads the closed socket (through the run's proxy), and until then runs what the worker sent and holds its
# listening session's offer lock (engine/handoff.py). A reservation for a killed worker later than this is a fault.
SESSION_END = timedelta(seconds=2)

AT_LEAST_ONCE, AT_MOST_ONCE, TRANSACTIONAL, POISON = "at_least_once", "at_most_once", "transactional", "poison"
EXAMPLES = 20
# Exception class names (execute.failed writes "Name: message") that mean the database went away under a handler.
DB_ERRORS = {
    "OperationalError",
    "InterfaceError",
    "AdminShutdown",
    "ConnectionFailure",
    "ConnectionException",
    "ConnectionDoesNotExist",
    "CannotConnectNow",
    "CrashShutdown",
    "ConnectionTimeout",
}
AMO_FAILED = "at-most-once attempt failed (not retried)"
AMO_STOPPED = DeadReason.AT_MOST_ONCE_STOPPED
LEASE_EXPIRED = "lease expired on the last attempt"
# A lease whose reply an outage swallowed was taken this shortly before the outage began (or during it).
LEASE_BEFORE_OUTAGE = timedelta(seconds=5)


@dataclass
class Expect:
    """What the run planted and did: every item id with its mode (or "poison"), the dead-letter reasons each
    poison item may have, the worker ids it killed (-9, with the time) or SIGTERMed, and the outages (connection
    cuts and restarts: start and end, wall clock, the database server's clock too: same machine)."""

    modes: dict[int, str]
    poison_reasons: dict[int, tuple[str, ...]]
    killed: dict[str, datetime]
    sigtermed: set[str] = field(default_factory=set)
    outages: list[tuple[datetime, datetime]] = field(default_factory=list)
    amo_killed: dict[int, str] = field(default_factory=dict)  # at-most-once items running when a kill_amo hit
    rate_limits: dict[str, tuple[int, int]] = field(default_factory=dict)  # queue -> (leases, per seconds)

    def killed_holding(self, res: Res) -> bool:
        """The reservation's worker was killed while the reservation was open; or it was made for that worker as
        its sessions ended (within SESSION_END of the kill: a statement it sent before, or an enqueue that handed
        it an item while its listening session still held the offer lock)."""
        at = self.killed.get(res.worker_id)
        return (
            at is not None
            and res.reserved_at <= at + SESSION_END
            and (res.finished_at is None or res.finished_at >= at)
        )

    def cut_off(self, res: Res) -> bool:
        """An outage overlapped the reservation: its live worker may have been unable to renew the lease."""
        end = res.finished_at or datetime.max.replace(tzinfo=res.reserved_at.tzinfo)
        return any(start - LEASE_BEFORE_OUTAGE <= end and res.reserved_at <= stop for start, stop in self.outages)

    def lease_reply_lost(self, res: Res) -> bool:
        """An expired lease of a live worker taken around an outage: committed, and the reply never came back,
        so the worker never knew it held the item."""
        return (
            res.outcome == "expired"
            and res.worker_id not in self.killed
            and any(start - LEASE_BEFORE_OUTAGE <= res.reserved_at <= end for start, end in self.outages)
        )


@dataclass
class Check:
    name: str
    passed: bool
    figures: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "figures": self.figures, "problems": self.problems}


def _db_error(res: Res) -> bool:
    return res.error.split(":", 1)[0].strip() in DB_ERRORS


def explain(res: Res | None, expect: Expect) -> str | None:
    """Why a run under `res` may be followed by another run of its item (None: it may not)."""
    if res is None:
        return None
    if res.outcome == "expired" and expect.killed_holding(res):
        return "killed"
    if res.outcome in ("retry", "timed_out") and _db_error(res):
        return "db-error"
    if res.outcome == "released" and res.worker_id in expect.sigtermed:
        return "sigterm-grace"
    return None


def _examples(problems: list[str]) -> list[str]:
    return problems[:EXAMPLES] + ([f"... and {len(problems) - EXAMPLES} more"] if len(problems) > EXAMPLES else [])


def _done_res(h: History, item_id: int) -> Res | None:
    return next((r for r in reversed(h.res_by_item.get(item_id, [])) if r.outcome == "done"), None)


def _amo_casualty(h: History, item_id: int, expect: Expect) -> str | None:
    """How a fault took an at-most-once item's single attempt, or None if it did not."""
    item, runs = h.items[item_id], h.runs_by_item.get(item_id, [])
    res = h.res_by_item.get(item_id, [])
    last = res[-1] if res else None
    if last is None:
        return None
    letters = h.dead_letters.get(item_id, [])
    if item.state == "dead" and last.outcome == "expired" and letters == [AMO_STOPPED] and len(runs) <= 1:
        if expect.killed_holding(last):
            return "killed mid-run (dead letter: worker stopped during an at-most-once run)"
        if expect.cut_off(last):
            return "cut off past its lease mid-run (dead letter: worker stopped during an at-most-once run)"
    if item.state == "dead" and not runs and last.outcome == "expired":
        if expect.killed_holding(last):
            return "killed before start (dead letter)"
        if expect.lease_reply_lost(last):
            return "lease reply lost in an outage (dead letter)"
    if item.state == "dead" and last.outcome == "dead" and _db_error(last):
        return "handler hit a database error (dead letter)"
    return None


# -- the checks ----------------------------------------------------------------------------------------------


def check_lost(h: History, expect: Expect) -> Check:
    """Every planted item is there and ended as its mode promises; nothing else was enqueued."""
    problems, casualties = [], Counter()
    missing = sorted(set(expect.modes) - set(h.items))
    extra = sorted(set(h.items) - set(expect.modes))
    problems += [f"item {i} was planted and is gone" for i in missing]
    problems += [f"item {i} ({h.items[i].task}) was never planted" for i in extra]
    problems += [f"item {i} is both in the hot table and in the history" for i in h.in_both]
    for item_id, mode in expect.modes.items():
        item = h.items.get(item_id)
        if item is None or mode == POISON:
            continue
        runs = h.runs_by_item.get(item_id, [])
        done = _done_res(h, item_id)
        if mode == AT_MOST_ONCE:
            why = _amo_casualty(h, item_id, expect)
            if why:
                casualties[why] += 1
            elif item.state != "done" or not runs:  # more than one run is the at-most-once check's to judge
                problems.append(f"at-most-once item {item_id} ended {item.state} after {len(runs)} runs, no fault")
        elif item.state != "done":
            problems.append(f"{mode} item {item_id} ended {item.state}")
        elif done is None or not any(r.reservation_id == done.id for r in runs):
            problems.append(f"{mode} item {item_id} is done but its handler never ran under the done reservation")
    states = Counter(i.state for i in h.items.values())
    figures = {
        "planted": len(expect.modes),
        "found": len(h.items),
        "done": states.get("done", 0),
        "dead": states.get("dead", 0),
        "open": states.get("ready", 0) + states.get("reserved", 0),
        "amo_casualties": dict(casualties),
        "archived": h.archived,
        "lost": len(problems),
    }
    return Check("lost 0", not problems, figures, _examples(problems))


def check_stuck(h: History, expect: Expect) -> Check:
    """Nothing open at the end: no item ready or reserved (past its lease or not), no attempt left open."""
    problems = []
    for item in h.items.values():
        if item.state in ("ready", "reserved"):
            late = item.state == "reserved" and h.now is not None and item.visible_at < h.now
            problems.append(f"item {item.id} still {item.state}{' past its lease' if late else ''}")
    dangling = [r for r in h.reservations.values() if r.outcome is None and h.items[r.item_id].reservation_id != r.id]
    problems += [f"reservation {r.id} of item {r.item_id} never ended and is not current" for r in dangling]
    past_lease = sum(
        1 for i in h.items.values() if i.state == "reserved" and h.now is not None and i.visible_at < h.now
    )
    figures = {
        "stuck": len(problems),
        "reserved_past_lease": past_lease,
        "open_attempts": sum(r.outcome is None for r in h.reservations.values()),
    }
    return Check("stuck 0", not problems, figures, _examples(problems))


def check_log(h: History, expect: Expect) -> Check:
    """Every run names a reservation of its own item with the same attempt, and no reservation ran twice."""
    problems = []
    per_res = Counter(run.reservation_id for run in h.runs)
    for run in h.runs:
        res = h.reservations.get(run.reservation_id)
        if res is None or res.item_id != run.item_id or res.attempt != run.attempt:
            problems.append(f"run {run.id} of item {run.item_id} names reservation {run.reservation_id}, not its own")
    problems += [f"reservation {rid} ran {n} times" for rid, n in per_res.items() if n > 1]
    return Check("runs match reservations", not problems, {"runs": len(h.runs)}, _examples(problems))


def check_duplicates(h: History, expect: Expect) -> Check:
    """Every run after an item's first is explained by how the attempt before it ended."""
    problems, details, why = [], [], Counter()
    for item_id, runs in h.runs_by_item.items():
        if len(runs) < 2:
            continue
        ordered = sorted(runs, key=lambda r: (r.executed_at, r.id))
        for earlier, later in zip(ordered, ordered[1:], strict=False):
            res = h.reservations.get(earlier.reservation_id)
            reason = explain(res, expect)
            why[reason or "unexplained"] += 1
            details.append(_duplicate(item_id, expect.modes.get(item_id, "?"), earlier, later, res, reason))
            if reason is None:
                outcome = res.outcome if res else "missing"
                problems.append(
                    f"item {item_id} ran again (reservation {later.reservation_id}) after a run under reservation "
                    f"{earlier.reservation_id} of {earlier.worker_id} that ended {outcome!r}"
                )
    figures = {
        "runs": len(h.runs),
        "items_run_more_than_once": sum(len(r) > 1 for r in h.runs_by_item.values()),
        "duplicates": sum(why.values()),
        "explained": {k: v for k, v in why.items() if k != "unexplained"},
        "unexplained": why.get("unexplained", 0),
    }
    return Check("every duplicate explained", not problems, figures, _examples(problems), details)


def _duplicate(item_id: int, mode: str, earlier: Run, later: Run, res: Res | None, reason: str | None) -> dict:
    return {
        "item": item_id,
        "mode": mode,
        "earlier_reservation": earlier.reservation_id,
        "earlier_worker": earlier.worker_id,
        "earlier_outcome": res.outcome if res else None,
        "later_reservation": later.reservation_id,
        "why": reason or "UNEXPLAINED",
    }


def check_at_most_once(h: History, expect: Expect) -> Check:
    ids = [i for i, mode in expect.modes.items() if mode == AT_MOST_ONCE]
    counts = Counter(len(h.runs_by_item.get(i, [])) for i in ids)
    problems = [f"at-most-once item {i} ran {n} times" for i in ids if (n := len(h.runs_by_item.get(i, []))) > 1]
    figures = {"items": len(ids), "ran_once": counts.get(1, 0), "never_ran": counts.get(0, 0)}
    figures["ran_twice_or_more"] = len(problems)
    return Check("at-most-once ran at most once", not problems, figures, _examples(problems))


def check_transactional(h: History, expect: Expect) -> Check:
    """A transactional item's database effect is there exactly once if it ended done, and not at all if not
    (its handler's writes rolled back with the failed settle)."""
    problems, done = [], 0
    for item_id in expect.modes:
        item = h.items.get(item_id)
        if item is None or item.task != "queue_app.probe_transactional":
            continue
        applied = h.effects.get(str(item_id), 0)
        if item.state == "done":
            done += 1
            if applied != 1:
                problems.append(f"transactional item {item_id} is done and its effect was applied {applied} times")
        elif applied:
            problems.append(f"transactional item {item_id} ended {item.state} and its effect was applied {applied}x")
    figures = {"done": done, "effects_not_once": len(problems)}
    return Check("transactional effects exactly once", not problems, figures, _examples(problems))


def check_fifo(h: History, expect: Expect) -> Check:
    """Per ordering key, in item-id order: every run of an item starts after the previous item's last attempt
    ended (settled done or dead). So the previous handler had returned (at-least-once, transactional: settled
    after the run) and no two items of a key were ever out at once. At-most-once settles before it runs, so
    its handler may still be running when the next item starts: counted, allowed."""
    by_key: dict[str, list[int]] = {}
    for item in h.items.values():
        if item.ordering_key is not None:
            by_key.setdefault(item.ordering_key, []).append(item.id)
    problems, pairs, amo_overlap = [], 0, 0
    for key, ids in by_key.items():
        ids.sort()
        for prev, nxt in zip(ids, ids[1:], strict=False):
            pairs += 1
            closed = h.close_time(prev)
            for run in h.runs_by_item.get(nxt, []):
                if closed is None or run.executed_at <= closed:
                    problems.append(
                        f"key {key}: item {nxt} ran at {run.executed_at:%H:%M:%S.%f} before item {prev} ended "
                        f"({'never' if closed is None else f'{closed:%H:%M:%S.%f}'})"
                    )
            # A run starts before its settle, so for the other modes the rule above already orders the runs.
            prev_runs, nxt_runs = h.runs_by_item.get(prev, []), h.runs_by_item.get(nxt, [])
            if prev_runs and nxt_runs and max(r.executed_at for r in prev_runs) > min(r.executed_at for r in nxt_runs):
                amo_overlap += expect.modes.get(prev) == AT_MOST_ONCE
    figures = {"keys": len(by_key), "ordered_items": sum(map(len, by_key.values())), "pairs": pairs}
    figures.update(violations=len(problems), amo_started_after_next=amo_overlap)
    return Check("per-key FIFO", not problems, figures, _examples(problems))


def check_rate_limits(h: History, expect: Expect) -> Check:
    """Per rate-limited queue, its leases (reservations, by their reserved_at: the lease's own clock, which also
    chose the window it counted against) per window of the period since the epoch: never more than the limit,
    whatever was killed, cut or restarted."""
    problems, windows, most, full = [], 0, 0, 0
    for queue, (limit, period) in expect.rate_limits.items():
        per_window = Counter(
            int(res.reserved_at.timestamp() // period)
            for res in h.reservations.values()
            if (item := h.items.get(res.item_id)) is not None and item.queue == queue
        )
        windows += len(per_window)
        most = max([most, *per_window.values()])
        full += sum(n == limit for n in per_window.values())
        problems += [
            f"queue {queue}: {n} leases in the {period} s window from {window * period} (limit {limit})"
            for window, n in sorted(per_window.items())
            if n > limit
        ]
    figures = {"queues": len(expect.rate_limits), "windows": windows, "windows_at_the_limit": full}
    figures["most_in_a_window"] = most
    return Check("rate limits held", not problems, figures, _examples(problems))


def check_dead_letters(h: History, expect: Expect) -> Check:
    """The dead letters are exactly the planted poison (each with a right reason), plus the at-most-once
    casualties a fault explains; nothing else died."""
    problems, casualties = [], Counter()
    dead = {i.id for i in h.items.values() if i.state == "dead"}
    for item_id, reasons in expect.poison_reasons.items():
        letters = h.dead_letters.get(item_id, [])
        if item_id not in dead or len(letters) != 1:
            problems.append(f"poison item {item_id} ended {h.items[item_id].state if item_id in h.items else 'gone'} "
                            f"with {len(letters)} dead letters")  # fmt: skip
        elif letters[0] not in reasons:
            problems.append(f"poison item {item_id} died for {letters[0]!r}, expected one of {reasons}")
        elif letters[0] in (LEASE_EXPIRED, AMO_STOPPED):  # right only when a fault took the lease: say which
            last = h.res_by_item[item_id][-1]
            if letters[0] == AMO_STOPPED and (expect.killed_holding(last) or expect.cut_off(last)):
                casualties["poison: stopped mid-run (at-most-once)"] += 1
            elif expect.killed_holding(last):
                casualties["poison: killed before its settle"] += 1
            elif expect.lease_reply_lost(last):
                casualties["poison: lease reply lost in an outage"] += 1
            else:
                problems.append(f"poison item {item_id}: lease expired under live worker {last.worker_id}")
    for item_id in sorted(dead - set(expect.poison_reasons)):
        why = _amo_casualty(h, item_id, expect) if expect.modes.get(item_id) == AT_MOST_ONCE else None
        if why is None:
            problems.append(f"item {item_id} ({h.items[item_id].task}) died and was not planted as poison")
        else:
            casualties[why] += 1
    stray = sorted(set(h.dead_letters) - dead)
    problems += [f"item {i} has an open dead letter but is {h.items[i].state}" for i in stray if i in h.items]
    found = sum(1 for i in expect.poison_reasons if i in dead)
    figures = {"planted": len(expect.poison_reasons), "poison_dead": found, "dead_items": len(dead)}
    figures.update(amo_casualties=dict(casualties), unexplained=len(problems))
    return Check("dead letters = planted poison", not problems, figures, _examples(problems))


def check_amo_killed_mid_run(h: History, expect: Expect) -> Check:
    """Every at-most-once item whose worker a kill_amo fault killed while its handler ran is a dead letter that
    says so (never done, never run twice)."""
    problems = []
    for item_id, worker_id in sorted(expect.amo_killed.items()):
        item, letters = h.items.get(item_id), h.dead_letters.get(item_id, [])
        runs = len(h.runs_by_item.get(item_id, []))
        done, killed_at = _done_res(h, item_id), expect.killed.get(worker_id)
        if (
            runs == 1 and done is not None and done.worker_id == worker_id and killed_at is not None
            and done.finished_at is not None and killed_at <= done.finished_at <= killed_at + SESSION_END
        ):  # fmt: skip
            continue  # its handler had finished: the settle the worker sent before its kill committed after it
        if item is None or item.state != "dead" or letters != [AMO_STOPPED] or runs > 1:
            state = item.state if item else "gone"
            problems.append(f"item {item_id} killed mid-run in {worker_id}: {state}, letters {letters}, {runs} runs")
    figures = {"killed_mid_run": len(expect.amo_killed), "dead_saying_so": len(expect.amo_killed) - len(problems)}
    return Check("at-most-once killed mid-run: dead letter says so", not problems, figures, _examples(problems))


def check_id_marks(h: History, expect: Expect) -> Check:
    """No item created, and no reservation made, at or after an id mark's time has an id at or below the mark's
    (engine/marks.py: the admin's time filters skip those ids), whatever was killed, cut or restarted."""
    times = [m[0] for m in h.marks]
    highest: list[tuple[int, int]] = []  # the highest (item, reservation) id of the marks up to each one
    for _, item_id, res_id in h.marks:
        last = highest[-1] if highest else (0, 0)
        highest.append((max(last[0], item_id), max(last[1], res_id)))
    problems = []
    rows = [(i.id, i.created_at, 0, "item") for i in h.items.values()]
    rows += [(r.id, r.reserved_at, 1, "reservation") for r in h.reservations.values()]
    for row_id, stamped, column, what in rows:
        n = bisect_right(times, stamped)  # the marks taken at or before the row's stamp
        if n and row_id <= highest[n - 1][column]:
            problems.append(f"{what} {row_id} stamped {stamped:%H:%M:%S.%f} has an id at or below a mark before it")
    figures = {"marks": len(h.marks), "rows": len(rows)}
    return Check("id marks bound every later row", not problems, figures, _examples(problems))


CHECKS = (
    check_lost,
    check_stuck,
    check_log,
    check_duplicates,
    check_at_most_once,
    check_transactional,
    check_fifo,
    check_rate_limits,
    check_dead_letters,
    check_amo_killed_mid_run,
    check_id_marks,
)


def run_checks(h: History, expect: Expect) -> list[Check]:
    return [check(h, expect) for check in CHECKS]
