"""A new attempt's steps from an ended attempt: what a repair (the same workflow, its next attempt) and a fork (a
new workflow, from a chosen step) write, planned here in one place.

On the stored graph (the default) the new steps are copies of the ended attempt's rows: the graph the workflow
started with, whatever the code says now. Onto the current definition, they are the steps of a graph built now
(workflows/versions.py, current); a step is kept only when the ended attempt has it succeeded (or skipped) with
the very same definition (task, payload, item spec, policy, compensation, conditions, dependencies).

Either way: steps that neither succeeded nor were skipped (or whose work a compensation undid), the fork's step,
and everything downstream of them run again; every other step is kept as it ended (KEPT_STATES: succeeded with
its result, item and run, or skipped), so a skipped step stays skipped unless something upstream of it runs
again (then its run_if is decided again). A kept branch keeps its result, so its choice: the steps it did not
choose stay skipped, and a re-run step downstream of it with nothing left to wait for is decided by the caller
before it is enqueued (services._run, queue_app_wf_decide), like every step whose dependencies all ended. A
re-run step fans out again (what it added last time is not copied); a kept step keeps what it fanned out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .definition import Graph, WorkflowError
from .models import StepDependency, StepKind, StepState, WorkflowStep

# What a step row takes from its definition: a checked StepSpec, or an earlier attempt's row.
DEFINED = ("name", "group", "kind", "target", "args", "spec", "on_failure", "compensate")
KEPT = ("item_id", "spark_run_id", "child_workflow_id", "result", "ready_at", "finished_at")
# The states a step is kept in (not run again) unless something upstream of it runs again.
KEPT_STATES = (StepState.SUCCEEDED, StepState.SKIPPED)


@dataclass
class Plan:
    rows: list[WorkflowStep] = field(default_factory=list)  # unsaved: write() sets workflow and attempt
    edges: list[tuple[str, str, bool]] = field(default_factory=list)  # (upstream, downstream, order_only) names
    parents: dict[str, str] = field(default_factory=dict)  # fan-out child -> the step that added it

    @property
    def waiting(self) -> int:
        return sum(row.state == StepState.WAITING for row in self.rows)


def _row(source: Any, old: WorkflowStep | None, *, pending: int = 0) -> WorkflowStep:
    """A new step from `source`'s definition: kept from `old` (as it ended: succeeded with its result, or
    skipped) or, without, waiting."""
    row = WorkflowStep(**{f: getattr(source, f) for f in DEFINED}, pending=pending)
    if old is not None:
        row.kept, row.state = True, old.state
        for f in KEPT:
            setattr(row, f, getattr(old, f))
    return row


def _closure(roots: Iterable[Any], down: dict[Any, list[Any]]) -> set[Any]:
    out, todo = set(roots), list(roots)
    while todo:
        for d in down.get(todo.pop(), []):
            if d not in out:
                out.add(d)
                todo.append(d)
    return out


def _unknown_step(name: str, known: Iterable[str], where: str) -> WorkflowError:
    names = sorted(known)
    shown = ", ".join(names[:20]) + (", …" if len(names) > 20 else "")
    return WorkflowError(f"no step {name!r} in {where} (its steps: {shown})")


def plan(
    old_rows: list[WorkflowStep],
    old_edges: list[StepDependency],
    *,
    graph: Graph | None = None,
    order: list[str] | None = None,
    from_step: str | None = None,
    where: str = "the workflow",
) -> Plan:
    """The next attempt after `old_rows` (an ended attempt, with its edges): on those rows, or with `graph` (and
    its `order`) onto that definition; `from_step` re-runs that step and what is downstream of it too (a fork).
    WorkflowError for a `from_step` the graph does not have, before anything is written."""
    undone = {s.compensates_id for s in old_rows if s.kind == StepKind.COMPENSATION}
    steps = {s.id: s for s in old_rows if s.kind != StepKind.COMPENSATION}
    if graph is None:
        return _on_stored(steps, old_edges, undone, from_step, where)
    return _onto(graph, order or graph.order(), steps, old_edges, undone, from_step, where)


def _on_stored(
    steps: dict[int, WorkflowStep],
    edges: list[StepDependency],
    undone: set[int],
    from_step: str | None,
    where: str,
) -> Plan:
    down: dict[int, list[int]] = {}
    for e in edges:
        if not e.order_only:  # a backfill's lanes are ordering, not data: a later day is not downstream
            down.setdefault(e.upstream_id, []).append(e.downstream_id)
    roots = {i for i, s in steps.items() if s.state not in KEPT_STATES or i in undone}
    if from_step is not None:
        chosen = next((i for i, s in steps.items() if s.name == from_step), None)
        if chosen is None:
            raise _unknown_step(from_step, (s.name for s in steps.values()), where)
        roots.add(chosen)
    rerun = _closure(roots, down)
    copies = {i: s for i, s in steps.items() if s.parent_id not in rerun}  # a re-run step fans out again
    pending = dict.fromkeys(copies, 0)
    for e in edges:
        if e.upstream_id in rerun and e.upstream_id in copies and e.downstream_id in copies:
            pending[e.downstream_id] += 1  # a kept upstream is done: nothing to wait for
    out = Plan()
    out.rows = [_row(s, None if i in rerun else s, pending=pending[i]) for i, s in copies.items()]
    out.edges = [
        (steps[e.upstream_id].name, steps[e.downstream_id].name, e.order_only)
        for e in edges
        if e.upstream_id in copies and e.downstream_id in copies
    ]
    out.parents = {s.name: steps[s.parent_id].name for s in copies.values() if s.parent_id in copies}
    return out


def _onto(
    graph: Graph,
    order: list[str],
    steps: dict[int, WorkflowStep],
    edges: list[StepDependency],
    undone: set[int],
    from_step: str | None,
    where: str,
) -> Plan:
    by_name = {s.name: s for s in steps.values() if s.parent_id is None}
    defined_after: dict[str, set[str]] = {}
    for e in edges:
        up, down = steps.get(e.upstream_id), steps.get(e.downstream_id)
        if up is not None and down is not None and up.parent_id is None and not e.order_only:
            defined_after.setdefault(down.name, set()).add(up.name)

    def same(name: str) -> bool:
        old, new = by_name.get(name), graph.steps[name]
        return (
            old is not None
            and old.state in KEPT_STATES
            and old.id not in undone
            and all(getattr(old, f) == getattr(new, f) for f in DEFINED)
            and defined_after.get(name, set()) == set(new.after)
        )

    roots = {n for n in order if not same(n)}
    children = [s for s in steps.values() if s.parent_id in steps]
    for child in children:  # a fan-out child to re-run: its parent fans out again
        if child.state not in KEPT_STATES or child.id in undone:
            roots.add(steps[child.parent_id].name)
    if from_step is not None:
        if from_step not in graph.steps:
            raise _unknown_step(from_step, graph.steps, f"the current definition of {graph.name!r}")
        roots.add(from_step)
    down: dict[str, list[str]] = {}
    for n in order:
        for up in graph.steps[n].after:
            down.setdefault(up, []).append(n)
    rerun = _closure(roots, down)
    out = Plan()
    for n in order:
        spec = graph.steps[n]
        waits = sum(up in rerun for up in spec.after)
        out.rows.append(_row(spec, None if n in rerun else by_name[n], pending=waits))
        out.edges.extend((up, n, False) for up in spec.after)
    for child in children:
        parent = steps[child.parent_id].name
        if parent in graph.steps and parent not in rerun:  # kept with the step that added it
            out.rows.append(_row(child, child))
            out.parents[child.name] = parent
            out.edges.extend((child.name, d, False) for d in down.get(parent, []))
    return out


def write(p: Plan, workflow_id: int, attempt: int) -> list[WorkflowStep]:
    """Write a plan as attempt `attempt` of workflow `workflow_id` (the caller holds its row lock): the steps,
    the links of kept fan-out children to their parent, the edges. Returns the rows written."""
    for row in p.rows:
        row.workflow_id, row.attempt = workflow_id, attempt
    rows = WorkflowStep.objects.bulk_create(p.rows, batch_size=2000)
    ids = {row.name: row.id for row in rows}
    for child, parent in p.parents.items():
        WorkflowStep.objects.filter(id=ids[child]).update(parent_id=ids[parent])
    StepDependency.objects.bulk_create(
        [StepDependency(upstream_id=ids[up], downstream_id=ids[down], order_only=o) for up, down, o in p.edges],
        batch_size=5000,
    )
    return rows
