"""The checks of `queue_chaos --workflow` (workflow.py), judged from the rows the run left: callable on any
database alias (the run's private cluster, or a test database with planted rows:
tests/project/in_process/test_chaos_checkers.py).

- no workflow stuck: the success path succeeded, the compensation path failed, no step of either left open;
- every step settled per its mode: each success-path step succeeded with its item done, a transactional probe's
  effect applied exactly once, an at-least-once probe run at least once;
- each fan-in fired once: every step's item enqueued exactly once (no item both hot and archived);
- no step before its dependencies: no step's item leased before each upstream step had succeeded;
- each child ran once, its step ended once: every sub-workflow step has one child (one workflow started per
  step, none twice), which succeeded with each of its steps' items enqueued once and done, and the step's wait
  item was settled done by the child's end (never leased), the step ending after its child;
- compensations: exactly the completed steps with a compensation were compensated, once each, all succeeded;
  the failing step failed and the step after it was cancelled;
- workers behaved: no worker died unasked.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from queue_app.models import ExecutionLog, ItemHistory, ProbeEffect, QueueItem
from queue_app.workflows.models import StepDependency, Workflow, WorkflowStep

from .checks import Check
from .history import first_leases

TRANSACTIONAL = "queue_app.probe_transactional"
AT_LEAST_ONCE = "queue_app.probe"


@dataclass(frozen=True)
class WorkflowRun:
    """What the run started and did: its two workflows' ids, its workers' crashes, how many kills it fired."""

    success: int
    failing: int
    crashes: list[str] = field(default_factory=list)
    kills: int = 0


def check_workflows(db: str, run: WorkflowRun) -> list[Check]:
    """Every check of the run, in the order the report prints them."""
    success = Workflow.objects.using(db).get(id=run.success)
    failing = Workflow.objects.using(db).get(id=run.failing)
    steps = {
        w.id: list(WorkflowStep.objects.using(db).filter(workflow=w, attempt=w.attempt)) for w in (success, failing)
    }
    every = [s for rows in steps.values() for s in rows]
    by_id = {s.id: s for s in every}
    # Hot and archived alike: the workers move finished items into the partitioned history during the run
    # (a step's item in both would be counted twice below, as a step enqueued twice).
    items = {}
    for model in (QueueItem, ItemHistory):
        for item in (
            model.objects.using(db)
            .filter(workflow_step_id__in=list(by_id))
            .only("id", "state", "workflow_step_id", "attempts")
        ):
            items.setdefault(item.id, []).append(item)
    doubled = [i for i, found in items.items() if len(found) > 1]
    items = {i: found[0] for i, found in items.items()}
    checks = []

    problems = []
    if success.state != "succeeded":
        problems.append(f"success-path workflow {success.id} is {success.state}")
    if failing.state != "failed":
        problems.append(f"compensation-path workflow {failing.id} is {failing.state}")
    open_steps = [s.name for s in every if s.state in ("waiting", "queued")]
    if open_steps:
        problems.append(f"{len(open_steps)} steps still open: {open_steps[:10]}")
    checks.append(Check("no workflow stuck", not problems, {"steps": len(every), "open": len(open_steps)}, problems))

    problems = []
    runs = Counter(ExecutionLog.objects.using(db).filter(item_id__in=list(items)).values_list("item_id", flat=True))
    effects = dict(ProbeEffect.objects.using(db).filter(key__in=[str(i) for i in items]).values_list("key", "applied"))
    modes = Counter()
    for s in steps[success.id]:
        item = items.get(s.item_id)
        if s.state != "succeeded" or item is None or item.state != "done":
            problems.append(f"{s.name}: step {s.state}, item {item and item.state}")
            continue
        if s.target == TRANSACTIONAL:
            modes["transactional"] += 1
            if effects.get(str(item.id)) != 1:
                problems.append(f"{s.name}: transactional effect applied {effects.get(str(item.id))} times")
        elif s.target == AT_LEAST_ONCE:
            modes["at_least_once"] += 1
            if runs[item.id] < 1:
                problems.append(f"{s.name}: at-least-once probe never ran")
    checks.append(Check("every step settled per its mode", not problems, dict(modes), problems[:20]))

    problems = []
    per_step = Counter(i.workflow_step_id for i in items.values())
    twice = {by_id[sid].name: n for sid, n in per_step.items() if n != 1}
    if doubled:
        problems.append(f"step items both hot and archived (a broken move): {doubled[:10]}")
    if twice:
        problems.append(f"steps enqueued more than once: {dict(list(twice.items())[:10])}")
    fan_ins = [s for s in every if s.name == "fan_in"]
    for s in fan_ins:
        if per_step.get(s.id) != 1:
            problems.append(f"fan-in of workflow {s.workflow_id} enqueued {per_step.get(s.id, 0)} times")
    checks.append(
        Check("each fan-in fired once", not problems, {"fan_ins": len(fan_ins), "items": len(items)}, problems)
    )

    problems = []
    first_lease = first_leases(db, list(items))
    edges = list(StepDependency.objects.using(db).filter(downstream_id__in=list(by_id)))
    for e in edges:
        up, down = by_id.get(e.upstream_id), by_id[e.downstream_id]
        started_at = first_lease.get(down.item_id)
        if started_at is None or up is None:
            continue
        if up.state != "succeeded" or up.finished_at is None or up.finished_at > started_at:
            problems.append(f"{down.name} started at {started_at} before {up.name} ({up.state}, {up.finished_at})")
    checks.append(Check("no step before its dependencies", not problems, {"edges": len(edges)}, problems[:20]))

    checks.append(_children_ran_once(db, every, items))

    problems = []
    f_steps = steps[failing.id]
    completed = {s.id for s in f_steps if s.kind != "compensation" and s.state == "succeeded" and s.compensate}
    undos = [s for s in f_steps if s.kind == "compensation"]
    undone = Counter(s.compensates_id for s in undos)
    if set(undone) != completed or any(n != 1 for n in undone.values()):
        problems.append(f"compensated {sorted(undone)} but completed with a compensation {sorted(completed)}")
    problems += [f"{s.name} {s.state}" for s in undos if s.state != "succeeded"]
    for s in f_steps:
        if s.name in ("boom",) and s.state != "failed":
            problems.append(f"boom is {s.state}")
        if s.name == "never" and s.state != "cancelled":
            problems.append(f"never is {s.state}")
    checks.append(
        Check(
            "compensations: exactly the completed, in reverse",
            not problems,
            {"compensations": len(undos)},
            problems,
        )
    )
    checks.append(Check("workers behaved", not run.crashes, {"kills": run.kills}, run.crashes))
    return checks


def _children_ran_once(db: str, every: list[WorkflowStep], items: dict[int, Any]) -> Check:
    """Each sub-workflow step's child started once and succeeded, every step of it enqueued once and done; the
    step's wait settled done once, by the child's end (its item never leased), not before the child ended."""
    problems = []
    subs = [s for s in every if s.kind == "workflow"]
    parents = sorted({s.workflow_id for s in subs})
    kids = {w.id: w for w in Workflow.objects.using(db).filter(started_by__in=[f"workflow {p}" for p in parents])}
    if len(kids) != len(subs):
        problems.append(f"{len(kids)} child workflows started for {len(subs)} sub-workflow steps")
    linked = Counter(s.child_workflow_id for s in subs)
    problems += [f"child workflow {c} linked to {n} steps" for c, n in linked.items() if n != 1]
    for s in subs:
        child, wait = kids.get(s.child_workflow_id), items.get(s.item_id)
        if s.state != "succeeded" or child is None or child.state != "succeeded":
            problems.append(f"{s.name}: step {s.state}, child {child and (child.id, child.state)}")
            continue
        if wait is None or wait.state != "done" or wait.attempts != 0:
            problems.append(f"{s.name}: its wait item {wait and (wait.state, wait.attempts)}, not settled by its child")
        if s.finished_at is None or child.finished_at is None or s.finished_at < child.finished_at:
            problems.append(f"{s.name}: ended at {s.finished_at}, its child at {child.finished_at}")
    kid_steps = list(
        WorkflowStep.objects.using(db).filter(workflow_id__in=list(kids)).only("id", "name", "state", "workflow_id")
    )
    enqueued: Counter[int] = Counter()
    done: set[int] = set()
    for model in (QueueItem, ItemHistory):
        for item_step, state in (
            model.objects.using(db)
            .filter(workflow_step_id__in=[k.id for k in kid_steps])
            .values_list("workflow_step_id", "state")
        ):
            enqueued[item_step] += 1
            if state == "done":
                done.add(item_step)
    for k in kid_steps:
        if k.state != "succeeded" or enqueued[k.id] != 1 or k.id not in done:
            problems.append(f"child {k.workflow_id} step {k.name}: {k.state}, its item enqueued {enqueued[k.id]} times")
    figures = {"sub_workflow_steps": len(subs), "children": len(kids), "child_steps": len(kid_steps)}
    return Check("each child ran once, its step ended once", not problems, figures, problems[:20])
