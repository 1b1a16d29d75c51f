"""Versions of a workflow definition (issue 39): what a run records, and the difference between two versions.

A run keeps the graph it started with: its steps are rows holding each step's whole definition (task, payload,
item spec, failure policy, compensation, edges), written when it starts; nothing of a running workflow is read
from the code again (a repair copies the rows, unless asked to rebuild onto the current definition). Each run
records its definition's version: the one declared (`@workflow(..., version="3")`), else the fingerprint of the
graph it built (the first 16 hex digits of the SHA-256 of its canonical shape, below). The shape of each version
is kept once (WorkflowVersion), so the admin can draw what changed between two versions.

A shape is, per step: kind, target (task, Spark job, event, permission), the names it waits for, its failure
policy, its compensation's task, its deadline and its conditions (the run_if rule and a branch's choices, as the
definition marked them in the step's spec: only a step that has them carries them, so a graph with no condition
has the shape, and the fingerprint, it had before conditions existed), and not its payload (which the parameters
fill).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..engine.alias import queue_db
from .definition import Graph, get_workflow
from .models import Workflow, WorkflowVersion

FIELDS = ("kind", "target", "after", "on_failure", "compensate", "deadline", "run_if", "branch")
CONDITIONS = ("run_if", "branch")  # in a step's shape only when its spec has them (workflows/definition.py)


def shape(graph: Graph) -> dict[str, dict[str, Any]]:
    """Each step's definition without its payload, by name: what a version is."""
    out = {}
    for name, step in graph.steps.items():
        deadline = step.spec.get("deadline")
        out[name] = {
            "kind": str(step.kind),
            "target": step.target,
            "after": sorted(step.after),
            "on_failure": str(step.on_failure),
            "compensate": (step.compensate or {}).get("task"),
            "deadline": None if not deadline else deadline.get("delay", deadline.get("until")),
        }
        out[name].update({f: step.spec[f] for f in CONDITIONS if f in step.spec})
    return out


def fingerprint(steps: dict[str, dict[str, Any]]) -> str:
    canonical = json.dumps(steps, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def version_of(declared: str, steps: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(version, fingerprint): the declared version, else the fingerprint."""
    fp = fingerprint(steps)
    return declared or fp, fp


def record(name: str, version: str, fp: str, steps: dict[str, dict[str, Any]], using: str | None = None) -> None:
    """Keep the shape of `version` of `name` (the first run of a version writes it; later ones change nothing)."""
    WorkflowVersion.objects.using(queue_db(using)).bulk_create(
        [WorkflowVersion(name=name, version=version, fingerprint=fp, shape=steps)], ignore_conflicts=True
    )


def current(workflow: Workflow) -> tuple[Graph, list[str], str, dict[str, dict[str, Any]]]:
    """The workflow's definition as the code has it now, built with the workflow's parameters: (graph, order,
    version, shape). UnknownWorkflow when no definition of its name is registered any more; a
    WorkflowDefinitionError (an unknown task...) when it no longer builds."""
    definition = get_workflow(workflow.name)
    graph, order = definition.graph(definition.validate(workflow.params))
    steps = shape(graph)
    return graph, order, version_of(definition.version, steps)[0], steps


@dataclass(frozen=True)
class Change:
    name: str
    change: str  # "added", "removed", "changed", "same"
    fields: tuple[tuple[str, Any, Any], ...] = ()  # (field, before, after) of a changed step


def diff(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[Change]:
    """Every step of either shape: added (only in `after`), removed, changed (which fields), or the same; in
    `after`'s order, then the removed ones."""
    out = []
    for name, new in after.items():
        old = before.get(name)
        if old is None:
            out.append(Change(name, "added"))
            continue
        fields = tuple((f, old.get(f), new.get(f)) for f in FIELDS if old.get(f) != new.get(f))
        out.append(Change(name, "changed" if fields else "same", fields))
    out.extend(Change(name, "removed") for name in before if name not in after)
    return out


def edges(*shapes: dict[str, dict[str, Any]]) -> set[tuple[str, str]]:
    """The dependencies of every shape given (up, down), for the drawing of a difference."""
    return {(up, name) for steps in shapes for name, s in steps.items() for up in s["after"]}
