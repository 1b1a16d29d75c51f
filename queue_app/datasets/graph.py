"""A dataset's lineage as a picture: Graphviz's `dot` lays out the neighbourhood (lineage.py) and draws SVG on the
server, as the workflow graph does (workflows/graph.py).

Datasets are boxes coloured by freshness (fresh, stale, missing, unknown), the dataset the page is about drawn
with a thick border; jobs are ellipses between them. Each node links to its page (a dataset's page, a job's runs)
and its tooltip says what the node is (freshness, last materialized, last check). The SVG of a dot source is
kept (render(), an LRU of 32 per process), so a page drawn again with nothing changed skips the layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
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
    return render(source(seen, summaries, dataset_url=dataset_url, job_url=job_url))


def _q(text: str) -> str:
    """A dot string: double-quoted, with backslashes and quotes escaped (dot escapes the SVG it writes)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**attrs: str) -> str:
    return "[" + " ".join(f"{key}={_q(value)}" for key, value in attrs.items()) + "]"


def source(
    seen: Neighbourhood,
    summaries: Mapping[str, Mapping[str, Any]],
    *,
    dataset_url: Callable[[str], str],
    job_url: Callable[[str], str],
) -> str:
    """The dot source of the drawing, written directly (the graphviz package's quoting of every attribute cost
    more than the rest of a 1,000-node page)."""
    ids: dict[str, str] = {}  # node key -> dot id

    def node_id(key: str) -> str:
        return ids.setdefault(key, f"n{len(ids)}")

    lines = [
        "digraph {",
        'graph [rankdir=LR bgcolor=transparent fontname="sans-serif" nodesep=0.25]',
        'node [fontname="sans-serif" fontsize=11]',
        'edge [color="#999999" arrowsize=0.7]',
    ]
    for name in seen.datasets:
        summary = summaries.get(name, {})
        freshness = summary.get("freshness", "unknown")
        fill, border = FRESHNESS_COLOURS.get(freshness, FRESHNESS_COLOURS["unknown"])
        tooltip = (
            f"dataset {name}: {freshness}; last materialized {summary.get('last_materialized') or 'never'}; "
            f"checks {summary.get('checks', 'none')}"
        )
        attrs = _attrs(
            label=f"{name}\n{freshness}",
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
        lines.append(f"{node_id(dataset_key(name))} {attrs}")
    for job in seen.jobs:
        attrs = _attrs(
            label=job,
            shape="ellipse",
            style="filled",
            fillcolor=JOB_COLOURS[0],
            color=JOB_COLOURS[1],
            tooltip=f"job {job}: its runs",
            URL=job_url(job),
            target="_top",
            **{"class": "ds-job"},
        )
        lines.append(f"{node_id(job_key(job))} {attrs}")
    lines.extend(f"{node_id(up)} -> {node_id(down)}" for up, down in sorted(seen.edges))
    lines.append("}")
    return "\n".join(lines)


@lru_cache(maxsize=32)
def render(source: str) -> str:
    """dot's SVG of `source`, kept for the next request that draws the same graph (the same nodes, edges and
    freshness): laying out a 1,000-node neighbourhood takes dot about 0.4 s, reading it again none."""
    out = graphviz.pipe("dot", "svg", source.encode()).decode()
    return out[out.index("<svg") :]
