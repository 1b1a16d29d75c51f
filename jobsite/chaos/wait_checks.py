"""The checks of `queue_chaos --waits` (waits.py), judged from the rows the run left: callable on any database
alias (the run's private cluster, or a test database with planted rows:
tests/project/in_process/test_chaos_checkers.py).

- every workflow succeeded (no wait lost, nothing stuck);
- every event sent stored once: each planned nonce stored exactly once, nothing unplanned, the sender sent all
  and exited 0;
- every event woke exactly one step once: per key exactly one event claimed, the oldest, by that key's wait,
  whose result is its payload; the unclaimed are exactly the second sends; both paths (an event kept then
  claimed, an event claimed live) exercised;
- the step after each wait ran once: enqueued once, its transactional effect applied once;
- nothing woke early: no nap leased or ended before its due time, no wait opened before its nap ended, no step
  after a wait leased before its event was sent nor started before the wait ended;
- workers behaved: no worker died unasked, the PostgreSQL restart fired.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from queue_app.models import ItemHistory, ProbeEffect, QueueItem
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep

from .checks import Check
from .history import first_leases

EVENT = "chaos.paid"


@dataclass(frozen=True)
class WaitRun:
    """What the run planned and did: key -> workflow id and nap seconds, the planned events' nonces (nonce -> key;
    the second sends among them), the sender's report (one JSON line per send), its exit code and log, the
    workers' crashes, the kills, the restart ("" if it never fired)."""

    workflows: dict[str, int]
    naps: dict[str, float]
    planted: dict[str, str]
    seconds: dict[str, str]
    sent: list[dict] = field(default_factory=list)
    sender_exit: int | None = 0
    sender_log: str = ""
    crashes: list[str] = field(default_factory=list)
    kills: int = 0
    restart: str = ""


def check_waits(db: str, run: WaitRun) -> list[Check]:
    """Every check of the run, in the order the report prints them."""
    ids = list(run.workflows.values())
    key_of = {wf_id: key for key, wf_id in run.workflows.items()}
    workflows = {w.id: w for w in Workflow.objects.using(db).filter(id__in=ids)}
    steps: dict[str, dict[str, WorkflowStep]] = defaultdict(dict)
    for s in WorkflowStep.objects.using(db).filter(workflow_id__in=ids, attempt=1):
        steps[key_of[s.workflow_id]][s.name] = s
    by_step = {s.id: s for named in steps.values() for s in named.values()}
    items: dict[int, list] = defaultdict(list)  # step id -> its items, hot and archived
    for model in (QueueItem, ItemHistory):
        for item in model.objects.using(db).filter(workflow_step_id__in=list(by_step)):
            items[item.workflow_step_id].append(item)
    events = list(WorkflowEvent.objects.using(db).filter(name=EVENT).order_by("id"))
    per_key = defaultdict(list)
    for e in events:
        per_key[e.key].append(e)
    checks = []

    problems = [f"{key} (workflow {w}) is {workflows[w].state}" for key, w in run.workflows.items()
                if workflows[w].state != "succeeded"]  # fmt: skip
    checks.append(Check("every workflow succeeded", not problems, {"workflows": len(ids)}, problems[:20]))

    problems = []
    stored = defaultdict(int)
    for e in events:
        stored[(e.payload or {}).get("nonce")] += 1
    problems += [f"{nonce} stored {stored[nonce]} times" for nonce in run.planted if stored[nonce] != 1]
    problems += [f"unplanned event {nonce}" for nonce in stored if nonce not in run.planted]
    lines = run.sent
    recovered = sum(line.get("recovered", False) for line in lines)
    retried = sum(line.get("retries", 0) > 0 for line in lines)
    code = run.sender_exit
    if len(lines) != len(run.planted) or code != 0:
        problems.append(f"sender sent {len(lines)} of {len(run.planted)}, exit {code} "
                        f"(log {run.sender_log})")  # fmt: skip
    figures = {"events": len(events), "sends_retried": retried, "reply_lost_found_stored": recovered}
    checks.append(Check("every event sent stored once", not problems, figures, problems[:20]))

    problems = []
    kept_then_claimed = live = 0
    for key, named in steps.items():
        wait = named.get("paid")
        claimed = [e for e in per_key[key] if e.step_id is not None]
        if wait is None or len(claimed) != 1:
            problems.append(f"{key}: {len(claimed)} events claimed")
            continue
        event = claimed[0]
        if event.step_id != wait.id:
            problems.append(f"{key}: its event ended step {event.step_id}, not its wait {wait.id}")
        if event.id != per_key[key][0].id:
            problems.append(f"{key}: event {event.id} claimed, not the oldest {per_key[key][0].id}")
        if wait.result != event.payload:
            problems.append(f"{key}: the wait's result {wait.result} is not its event's payload")
        if wait.ready_at is not None and event.created_at < wait.ready_at:
            kept_then_claimed += 1
        else:
            live += 1
    unclaimed = {(e.payload or {}).get("nonce") for e in events if e.step_id is None}
    if unclaimed != set(run.seconds):
        problems.append(f"unclaimed events {sorted(unclaimed ^ set(run.seconds))[:10]} differ from the second sends")
    if not (kept_then_claimed and live):
        problems.append(f"the run did not exercise both paths: {kept_then_claimed} kept, {live} live")
    figures = {"claimed": len(events) - len(unclaimed), "kept_then_claimed": kept_then_claimed, "live": live,
               "second_sends_kept": len(unclaimed)}  # fmt: skip
    checks.append(Check("every event woke exactly one step once", not problems, figures, problems[:20]))

    problems = []
    afters = [named["after"] for named in steps.values() if "after" in named]
    effects = dict(ProbeEffect.objects.using(db).values_list("key", "applied"))
    for s in afters:
        found = items.get(s.id, [])
        if len(found) != 1:
            problems.append(f"{key_of[s.workflow_id]}: the step after the wait enqueued {len(found)} times")
        elif effects.get(str(found[0].id)) != 1:
            problems.append(f"{key_of[s.workflow_id]}: its effect applied {effects.get(str(found[0].id))} times")
    if len(afters) != len(ids):
        problems.append(f"{len(ids) - len(afters)} workflows lack their step after the wait")
    checks.append(Check("the step after each wait ran once", not problems, {"steps": len(afters)}, problems[:20]))
    checks.append(_check_early(db, run, steps, items, per_key))
    problems = list(run.crashes)
    if not run.restart:
        problems.append("the PostgreSQL restart did not fire before the waits were over")
    figures = {"kills": run.kills, "restarts": int(bool(run.restart))}
    checks.append(Check("workers behaved", not problems, figures, problems))

    return checks


def _check_early(db: str, run: "WaitRun", steps, items, per_key) -> Check:
    """Nothing woke early, every timestamp the server's clock."""
    nap_items = {found[0].id: (key, found[0]) for key, named in steps.items()
                 for found in [items.get(named["nap"].id, [])] if found}  # fmt: skip
    first_lease = first_leases(db, list(nap_items))
    after_leases = first_leases(db, [named["after"].item_id for named in steps.values()])
    problems, margins = [], []
    for item_id, (key, item) in nap_items.items():
        due = item.created_at + timedelta(seconds=run.naps[key])
        nap = steps[key]["nap"]
        leased = first_lease.get(item_id)
        if leased is None or leased < due or item.run_at < due:
            problems.append(f"{key}: nap due {due} (run_at {item.run_at}) leased at {leased}")
        if nap.finished_at is None or nap.finished_at < due:
            problems.append(f"{key}: nap due {due} ended at {nap.finished_at}")
        else:
            margins.append((nap.finished_at - due).total_seconds())
    for key, named in steps.items():
        nap, wait, after = named["nap"], named["paid"], named["after"]
        if wait.ready_at is None or nap.finished_at is None or wait.ready_at < nap.finished_at:
            problems.append(f"{key}: wait opened at {wait.ready_at}, nap ended at {nap.finished_at}")
        # Timestamps are transaction starts: the transaction that ends a wait may begin before the event's
        # and still see it (READ COMMITTED: each statement sees what committed before it), so the wait's own
        # end time may read earlier than the event's. What runs after the wait is leased by a transaction that
        # began after both committed: its first lease is never before the event was sent.
        claimed = [e for e in per_key[key] if e.step_id == wait.id]
        leased = after_leases.get(after.item_id)
        if claimed and (wait.finished_at is None or leased is None or leased < claimed[0].created_at):
            problems.append(f"{key}: the step after the wait leased at {leased}, its event sent at "
                            f"{claimed[0].created_at}")  # fmt: skip
        if after.ready_at is None or wait.finished_at is None or after.ready_at < wait.finished_at:
            problems.append(f"{key}: after started at {after.ready_at}, wait ended at {wait.finished_at}")
    if len(nap_items) != len(steps):
        problems.append(f"{len(steps) - len(nap_items)} naps without an item")
    margins.sort()
    figures = {"naps": len(margins), "late_p50_ms": round(margins[len(margins) // 2] * 1000) if margins else None}
    return Check("nothing woke early", not problems, figures, problems[:20])
