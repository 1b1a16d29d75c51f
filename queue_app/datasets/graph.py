"""A dataset's lineage as a picture: Graphviz's `dot` lays out the neighbourhood (lineage.py) and draws SVG on the
server, as the workflow graph does (workflows/graph.py).

Datasets are boxes coloured by freshness (fresh, stale, missing, unknown), the dataset the page is about drawn
with a thick border; jobs are ellipses between them. Each node links to its page (a dataset's page, a job's runs)
and its tooltip says what the node is (freshness, last materialized, last check).

The layout depends only on the graph (its nodes, edges and links), which changes only when declarations or
lineage change, not when data is materialized: dot draws the graph once with a placeholder per dataset for what
changes (its colours, its freshness word and its tooltip), the drawing is kept by a fingerprint of the graph,
cut at its placeholders (layout(), an LRU of 32 per process), and each request joins the pieces with its
datasets' values in between. Laying out a 1,000-node neighbourhood takes dot about 0.4 s; filling it in, a few ms.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from html import escape
from typing import Any

from ..drawing import drawn
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
    drawing = drawn(lambda graphviz: layout(seen, dataset_url=dataset_url, job_url=job_url))
    if isinstance(drawing, str):  # the note that Graphviz is missing
        return drawing
    static, slots = drawing
    filled: list[tuple[str, str, str, str]] = []  # per dataset node: freshness, tooltip, fill, border
    for name in seen.datasets:
        summary = summaries.get(name, {})
        freshness = summary.get("freshness", "unknown")
        fill, border = FRESHNESS_COLOURS.get(freshness, FRESHNESS_COLOURS["unknown"])
        tooltip = (
            f"dataset {name}: {freshness}; last materialized {summary.get('last_materialized') or 'never'}; "
            f"checks {summary.get('checks', 'none')}"
        )
        filled.append((escape(freshness), escape(tooltip), fill, border))
    out = [static[0]]
    for (what, node), text in zip(slots, static[1:], strict=True):
        out.append(filled[node][what])
        out.append(text)
    return "".join(out)


# A dataset node's placeholders in the laid-out SVG: @F<i>@ its freshness (label and class), @T<i>@ its tooltip
# (dataset names cannot hold "@"), and its colours #fe<i> (fill) and #fd<i> (border), i in four hex digits
# (MAX_NODES is below 65,536; no colour of the palette starts with #fe or #fd).
PLACEHOLDER = re.compile(r"@([FT])(\d+)@|#f([ed])([0-9a-f]{4})")


def _q(text: str) -> str:
    """A dot string: double-quoted, with backslashes and quotes escaped (dot escapes the SVG it writes)."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**attrs: str) -> str:
    return "[" + " ".join(f"{key}={_q(value)}" for key, value in attrs.items()) + "]"


def fingerprint(seen: Neighbourhood, *, dataset_url: Callable[[str], str], job_url: Callable[[str], str]) -> str:
    """What the layout depends on: the graph's nodes in order, its edges and where its links point."""
    digest = hashlib.sha256()
    for part in (
        seen.dataset,
        *seen.datasets,
        "\0jobs",
        *seen.jobs,
        "\0edges",
        *(f"{up}>{down}" for up, down in sorted(seen.edges)),
        "\0labels",
        *(f"{up}>{down}:{label}" for (up, down), label in sorted(seen.labels.items())),
        "\0links",
        dataset_url("-"),
        job_url("-"),
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def source(seen: Neighbourhood, *, dataset_url: Callable[[str], str], job_url: Callable[[str], str]) -> str:
    """The dot source of the graph with the placeholders of each dataset node, written directly (the graphviz
    package's quoting of every attribute cost more than the rest of a 1,000-node page)."""
    ids: dict[str, str] = {}  # node key -> dot id

    def node_id(key: str) -> str:
        return ids.setdefault(key, f"n{len(ids)}")

    lines = [
        "digraph {",
        'graph [rankdir=LR bgcolor=transparent fontname="sans-serif" nodesep=0.25]',
        'node [fontname="sans-serif" fontsize=11]',
        'edge [color="#999999" arrowsize=0.7 fontname="sans-serif"]',
    ]
    for i, name in enumerate(seen.datasets):
        attrs = _attrs(
            label=f"{name}\n@F{i}@",
            shape="box",
            style="rounded,filled",
            fillcolor=f"#fe{i:04x}",
            color=f"#fd{i:04x}",
            penwidth="2.5" if name == seen.dataset else "1",
            tooltip=f"@T{i}@",
            URL=dataset_url(name),
            target="_top",
            **{"class": f"ds-node freshness-@F{i}@"},
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
    for up, down in sorted(seen.edges):
        label = seen.labels.get((up, down))
        drawn_label = " " + _attrs(label=label, fontsize="9", fontcolor="#666666") if label else ""
        lines.append(f"{node_id(up)} -> {node_id(down)}{drawn_label}")
    lines.append("}")
    return "\n".join(lines)


LAYOUTS_KEPT = 32
Layout = tuple[list[str], list[tuple[int, int]]]  # the SVG's text between placeholders; each one's (what, node)
_layouts: OrderedDict[str, Layout] = OrderedDict()
_layouts_lock = threading.Lock()
SLOTS = {"F": 0, "T": 1, "e": 2, "d": 3}  # a placeholder's kind -> its place in svg()'s per-node tuple


def layout(seen: Neighbourhood, *, dataset_url: Callable[[str], str], job_url: Callable[[str], str]) -> Layout:
    """dot's SVG of the graph cut at its placeholders, kept by the graph's fingerprint for the next request that
    draws the same graph (whatever its datasets' freshness by then)."""
    key = fingerprint(seen, dataset_url=dataset_url, job_url=job_url)
    with _layouts_lock:
        if key in _layouts:
            _layouts.move_to_end(key)
            return _layouts[key]
    if len(seen.datasets) > 0xFFFF:
        raise ValueError("too many datasets for one drawing")
    import graphviz

    out = graphviz.pipe("dot", "svg", source(seen, dataset_url=dataset_url, job_url=job_url).encode()).decode()
    drawn = out[out.index("<svg") :]
    static, slots, at = [], [], 0
    for match in PLACEHOLDER.finditer(drawn):
        static.append(drawn[at : match.start()])
        if match.group(1):
            slots.append((SLOTS[match.group(1)], int(match.group(2))))
        else:
            slots.append((SLOTS[match.group(3)], int(match.group(4), 16)))
        at = match.end()
    static.append(drawn[at:])
    with _layouts_lock:
        _layouts[key] = (static, slots)
        while len(_layouts) > LAYOUTS_KEPT:
            _layouts.popitem(last=False)
    return static, slots
