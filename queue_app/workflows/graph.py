"""A workflow's current attempt as a picture: Graphviz's `dot` lays it out (the `graphviz` package, Debian's
graphviz runs it) and draws SVG, here on the server.

Steps of one fan-out (siblings: same group, more than one) are drawn as one node with their count by state, so a
10,000-step fan-out is one node, not 10,000. Nodes are coloured by state and link to the step's queue item or
Spark run (a collapsed node to the steps table filtered to its group).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..drawing import drawn
from ..hooks import why_held
from .models import StepDependency, Workflow, WorkflowStep

COLOURS = {  # fill, border: the admin's palette
    "waiting": ("#f8f8f8", "#999999"),
    "queued": ("#e1effa", "#79aec8"),
    "running": ("#bcdcf2", "#417690"),
    "succeeded": ("#dff2dc", "#3c8a2e"),
    "failed": ("#fbe3e1", "#ba2121"),
    "cancelled": ("#eeeeee", "#666666"),
    "skipped": ("#fdf6e3", "#b58900"),  # its run_if was not met, or its branch chose another step
    "blocked": ("#fde8d7", "#c05a00"),  # a Spark step parked on a dataset partition's failed or pending checks
}
# A worse state wins the colour of a collapsed node.
SEVERITY = ("failed", "blocked", "running", "queued", "waiting", "cancelled", "skipped", "succeeded")


@dataclass
class Node:
    key: str
    label: str
    states: Counter = field(default_factory=Counter)
    url: str = ""
    tooltip: str = ""

    @property
    def state(self) -> str:
        return next((s for s in SEVERITY if self.states.get(s)), "waiting")


def step_states(workflow: Workflow) -> list[tuple[WorkflowStep, str]]:
    """The current attempt's steps with their shown state: `running` for a queued step whose item is leased,
    `blocked` for one parked on a dataset partition that is not usable (datasets/checks_run.py)."""
    from ..models import QueueItem

    steps = list(WorkflowStep.objects.filter(workflow=workflow, attempt=workflow.attempt).order_by("id"))
    queued = [s.item_id for s in steps if s.state == "queued" and s.item_id]
    leased = set(QueueItem.objects.filter(id__in=queued, state="reserved").values_list("id", flat=True))
    parked = why_held(s.item_id for s in steps if s.kind == "spark" and s.state == "queued")

    def shown(s: WorkflowStep) -> str:
        if s.state == "queued" and s.item_id in leased:
            return "running"
        return "blocked" if s.state == "queued" and s.item_id in parked else s.state

    return [(s, shown(s)) for s in steps]


def nodes_and_edges(
    workflow: Workflow, steps: list[tuple[WorkflowStep, str]], link: Callable[[WorkflowStep], str]
) -> tuple[dict[str, Node], set[tuple[str, str]]]:
    by_group: dict[str, list[WorkflowStep]] = defaultdict(list)
    for step, _ in steps:
        by_group[step.group].append(step)
    key_of: dict[int, str] = {}
    nodes: dict[str, Node] = {}
    group_keys = {name: f"g{i}" for i, name in enumerate(by_group)}  # dot reads "a:b" as node a, port b
    for step, state in steps:
        siblings = by_group[step.group]
        collapsed = len(siblings) > 1
        key = group_keys[step.group] if collapsed else f"s{step.id}"
        key_of[step.id] = key
        node = nodes.get(key)
        if node is None:
            node = nodes[key] = Node(key, step.group if collapsed else step.name)
            node.url = link(step) if not collapsed else ""
            node.tooltip = f"{step.kind} {step.target}"
        node.states[state] += 1
    for node in nodes.values():
        total = sum(node.states.values())
        if total > 1:
            counts = ", ".join(f"{n} {s}" for s, n in sorted(node.states.items(), key=lambda kv: SEVERITY.index(kv[0])))
            node.label = f"{node.label} ×{total}\n{counts}"
        else:
            node.label = f"{node.label}\n{node.state}"
    edges = set()
    ids = list(key_of)
    for up, down in StepDependency.objects.filter(downstream_id__in=ids).values_list("upstream_id", "downstream_id"):
        if up in key_of and key_of[up] != key_of[down]:
            edges.add((key_of[up], key_of[down]))
    for step, _ in steps:  # a fan-out's parent points at what it added
        if step.parent_id in key_of and key_of[step.parent_id] != key_of[step.id]:
            edges.add((key_of[step.parent_id], key_of[step.id]))
    return nodes, edges


def svg(workflow: Workflow, steps: list[tuple[WorkflowStep, str]], link: Callable[[WorkflowStep], str]) -> str:
    """The graph as an SVG document (no XML prologue: it is inlined in the page)."""
    nodes, edges = nodes_and_edges(workflow, steps, link)
    return drawn(lambda graphviz: _svg(graphviz, nodes, edges))


def _svg(graphviz: ModuleType, nodes: dict[str, Any], edges: set[tuple[str, str]]) -> str:
    dot = graphviz.Digraph(
        graph_attr={"rankdir": "LR", "bgcolor": "transparent", "fontname": "sans-serif", "nodesep": "0.3"},
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "sans-serif", "fontsize": "11"},
        edge_attr={"color": "#999999", "arrowsize": "0.7"},
    )
    for node in nodes.values():
        fill, border = COLOURS[node.state]
        attrs = {"fillcolor": fill, "color": border, "tooltip": node.tooltip, "class": f"wf-node state-{node.state}"}
        if node.url:
            attrs.update(URL=node.url, target="_top")
        dot.node(node.key, node.label, **attrs)
    for up, down in sorted(edges):
        dot.edge(up, down)
    out = dot.pipe(format="svg", encoding="utf-8")
    return out[out.index("<svg") :]


# -- the difference between two versions of a definition (the admin's versions page) -------------------------

DIFF_COLOURS = {
    "added": ("#dff2dc", "#3c8a2e"),
    "removed": ("#fbe3e1", "#ba2121"),
    "changed": ("#fff4d6", "#c79a00"),
    "same": ("#f8f8f8", "#999999"),
}


def diff_svg(changes: list[tuple[str, str, str]], edges: set[tuple[str, str]]) -> str:
    """Both versions' steps as one graph, each (name, change, tooltip) coloured by its change (added, removed,
    changed, same), with the dependencies of either version; SVG as `svg`'s."""
    return drawn(lambda graphviz: _diff_svg(graphviz, changes, edges))


def _diff_svg(graphviz: ModuleType, changes: list[tuple[str, str, str]], edges: set[tuple[str, str]]) -> str:
    dot = graphviz.Digraph(
        graph_attr={"rankdir": "LR", "bgcolor": "transparent", "fontname": "sans-serif", "nodesep": "0.3"},
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "sans-serif", "fontsize": "11"},
        edge_attr={"color": "#999999", "arrowsize": "0.7"},
    )
    keys = {name: f"n{i}" for i, (name, _, _) in enumerate(changes)}
    for name, change, tooltip in changes:
        fill, border = DIFF_COLOURS[change]
        style = "rounded,filled,dashed" if change == "removed" else "rounded,filled"
        dot.node(
            keys[name],
            f"{name}\n{change}",
            fillcolor=fill,
            color=border,
            style=style,
            tooltip=tooltip,
            **{"class": f"wf-node change-{change}"},
        )
    for up, down in sorted(edges):
        if up in keys and down in keys:
            dot.edge(keys[up], keys[down])
    out = dot.pipe(format="svg", encoding="utf-8")
    return out[out.index("<svg") :]
