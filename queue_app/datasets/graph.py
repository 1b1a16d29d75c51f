"""A dataset's lineage as a picture: Graphviz's `dot` lays out the neighbourhood (lineage.py) and draws SVG on the
server, as the workflow graph does (workflows/graph.py).

Datasets are boxes coloured by freshness (fresh, stale, missing, unknown), the dataset the page is about drawn
with a thick border; jobs are ellipses between them. Each node links to its page (a dataset's page, a job's runs)
and its tooltip says what the node is (freshness, last materialized, last check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import graphviz

from .lineage import Neighbourhood, dataset_key, job_key

FRESHNESS_COLOURS = {  # fill, border: the admin's palette (workflows/graph.py's)
    "fresh": ("#dff2dc", "#3c8a2e"),
    "stale": ("#fbe3e1", "#ba2121"),
    "missing": ("#f8f8f8", "#999999"),
    "unknown": ("#e1effa", "#79aec8"),
}
JOB_COLOURS = ("#ffffff", "#417690")


def svg(
    seen: Neighbourhood,
    summaries: Mapping[str, Mapping[str, Any]],
    *,
    dataset_url: Callable[[str], str],
    job_url: Callable[[str], str],
) -> str:
    """The neighbourhood as an SVG document (no XML prologue: it is inlined in the page). `summaries` holds
    each dataset's `dataset list` entry (freshness, last_materialized, checks); one missing is "unknown"."""
    dot = graphviz.Digraph(
        graph_attr={"rankdir": "LR", "bgcolor": "transparent", "fontname": "sans-serif", "nodesep": "0.25"},
        node_attr={"fontname": "sans-serif", "fontsize": "11"},
        edge_attr={"color": "#999999", "arrowsize": "0.7"},
    )
    ids: dict[str, str] = {}  # node key -> dot id: dot reads "a:b" as node a, port b

    def node_id(key: str) -> str:
        return ids.setdefault(key, f"n{len(ids)}")

    for name in seen.datasets:
        summary = summaries.get(name, {})
        freshness = summary.get("freshness", "unknown")
        fill, border = FRESHNESS_COLOURS.get(freshness, FRESHNESS_COLOURS["unknown"])
        tooltip = (
            f"dataset {name}: {freshness}; last materialized {summary.get('last_materialized') or 'never'}; "
            f"checks {summary.get('checks', 'none')}"
        )
        dot.node(
            node_id(dataset_key(name)),
            f"{name}\n{freshness}",
            shape="box",
            style="rounded,filled",
            fillcolor=fill,
            color=border,
            penwidth="2.5" if name == seen.dataset else "1",
            tooltip=tooltip,
            URL=dataset_url(name),
            target="_top",
            **{"class": f"ds-node freshness-{freshness}"},
        )
    for job in seen.jobs:
        dot.node(
            node_id(job_key(job)),
            job,
            shape="ellipse",
            style="filled",
            fillcolor=JOB_COLOURS[0],
            color=JOB_COLOURS[1],
            tooltip=f"job {job}: its runs",
            URL=job_url(job),
            target="_top",
            **{"class": "ds-job"},
        )
    for up, down in sorted(seen.edges):
        dot.edge(node_id(up), node_id(down))
    out = dot.pipe(format="svg", encoding="utf-8")
    return out[out.index("<svg") :]
