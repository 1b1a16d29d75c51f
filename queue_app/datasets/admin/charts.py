"""The datasets app's chart as a plotly figure, on the core's chart plumbing (queue_app/admin/charts.py): a
dataset's materializations over time; a click on a point written by a Spark run opens the run (the Spark app's
run_url: datasets require the Spark app).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ...admin.charts import chart_layout, missing_figure, plotly_js_path, plotly_template, show_range, time_range
from ...spark.admin.charts import run_url

FIGURE_COLOURS = {"rows": "#1565c0", "bytes": "#ef6c00", "files": "#6a1b9a"}  # the materializations chart's


def materializations_figure(history: Iterable[Any], dataset: str) -> dict[str, Any] | None:
    """A dataset's materializations over time: rows (left axis) and bytes (right axis), one point each, of the
    figures its materializations have (an observed dataset has bytes, no rows: its one axis is then bytes, never
    an empty axis; files when there is neither); a click on a point written by a Spark run opens the run.
    The legend sits above the plot, right, clear of the right axis' labels. The figure is written as plotly's
    JSON directly: plotly's validation of 500 points cost more than the rest of the dataset page."""
    points = sorted(history, key=lambda m: (m.at, m.id))
    if not points:
        return None
    runs_at = run_url(0)
    links = [
        [runs_at.replace("/0/", f"/{m.spark_run_id}/") if m.spark_run_id else "", m.partition or "-", m.source]
        for m in points
    ]
    x = [m.at for m in points]
    kept = [what for what in ("rows", "bytes") if any(getattr(m, what) is not None for m in points)]
    if not kept:
        kept = ["files"] if any(m.files is not None for m in points) else ["rows"]
    axes = [(what, axis, FIGURE_COLOURS[what]) for what, axis in zip(kept, ("y", "y2"), strict=False)]
    traces = [
        {
            "type": "scatter",
            "name": what,
            "x": x,
            "y": [getattr(m, what) for m in points],
            "yaxis": axis,
            "mode": "lines+markers",
            "line": {"width": 1},
            "marker": {"size": 7, "color": color},
            "connectgaps": False,
            "customdata": links,
            "hovertemplate": f"partition %{{customdata[1]}} (%{{customdata[2]}}): %{{y:,}} {what}<br>"
            "%{x|%Y-%m-%d %H:%M:%S} UTC<extra></extra>",
        }
        for what, axis, color in axes
    ]
    layout = chart_layout(f"Materializations of {dataset}", kept[0])
    show_range(layout, time_range(x, pad=timedelta(hours=12)))
    layout["yaxis"].update(tickformat="~s", automargin=True)
    if len(kept) > 1:
        layout["yaxis2"] = {
            "title": {"text": kept[1]},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "tickformat": "~s",
            "tickmode": "auto",
            "showgrid": False,
            "automargin": True,
        }
    layout["legend"] = {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"}
    layout["margin"]["r"] = 20
    layout["template"] = plotly_template()
    if plotly_js_path() is None:
        return missing_figure()
    return {"data": traces, "layout": layout}
