"""The admin's charts as plotly figures: built in Python (plotly.graph_objects), drawn in the page by plotly.js,
which the plotly wheel carries and the admin serves itself (`plotly_js`), never a CDN.

Here: the plumbing every chart shares (plotly loaded or missing, the layout, time ranges, the figure's script,
the colours) and the core's own figure, the overview's throughput. A layer's figures live in its app and build
on these: the Spark runs' (queue_app/spark/admin/charts.py), a dataset's materializations
(queue_app/datasets/admin/charts.py).

Every chart has axes with units, hover values and a time range (range buttons and a range slider on time axes);
a click on a point opens what it stands for (`customdata[0]` is a URL: a run's page, a filtered list).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import FileResponse, Http404, HttpRequest
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

STATE_COLORS = {"succeeded": "#2e7d32", "failed": "#c62828", "cancelled": "#757575", "timed_out": "#ef6c00"}
# A time axis spans at least this much: plotly draws one point's axis as a millisecond either side of it.
MIN_TIME_SPAN = timedelta(hours=2)
TIME_RANGES = [
    {"count": 1, "label": "1h", "step": "hour", "stepmode": "backward"},
    {"count": 1, "label": "1d", "step": "day", "stepmode": "backward"},
    {"count": 7, "label": "7d", "step": "day", "stepmode": "backward"},
    {"step": "all", "label": "all"},
]


# Without plotly (the `charts` extra), each chart's place says so; the figures' numbers are in the pages' tables.
MISSING = "Charts need plotly: pip install 'jobsite[charts]'."


@cache
def plotly_js_path() -> str | None:
    try:
        import plotly
    except ImportError:
        return None
    return os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")


def plotly_js(request: HttpRequest) -> FileResponse:
    """plotly.min.js from the installed wheel (cached a day by the browser); 404 without plotly."""
    if plotly_js_path() is None:
        raise Http404(MISSING)
    response = FileResponse(open(plotly_js_path(), "rb"), content_type="text/javascript")  # noqa: SIM115 (it closes it)
    response["Cache-Control"] = "private, max-age=86400"
    return response


def chart_layout(title: str, y_title: str, *, time_axis: bool = True, **extra: Any) -> dict[str, Any]:
    """A chart's layout: no width (the page's script sizes it to its box), the title in its own band at the top
    and the range buttons in the band below it, above the plot (the title once lay over the buttons)."""
    xaxis: dict[str, Any] = {"title": {"text": "time (UTC)"}, "type": "date"}
    if time_axis:
        xaxis.update(
            rangeselector={"buttons": TIME_RANGES, "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"},
            rangeslider={"visible": True, "thickness": 0.08},
        )
    return {
        "title": {
            "text": title,
            "font": {"size": 14},
            "x": 0,
            "xref": "paper",
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 8},
        },
        "xaxis": xaxis,
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "height": extra.pop("height", 380 if time_axis else 360),
        "autosize": True,
        "margin": {"l": 60, "r": 20, "t": 76 if time_axis else 40, "b": 40},
        "hovermode": "closest",
        # Beside the plot, top right (plotly widens the right margin for it): below it, a legend lay over the
        # first tick labels of the time axis and the range slider.
        "legend": {"x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top"},
        **extra,
    }


def time_range(xs: list[datetime], at_least: timedelta = MIN_TIME_SPAN, pad: timedelta | None = None) -> list[Any]:
    """A time axis' range around `xs`: at least `at_least` wide, centred on the points when they span less (one
    point, or a few close together), else the points' span with `pad` (at least 2% of it) either side."""
    first, last = min(xs), max(xs)
    if last - first < at_least:
        centre = first + (last - first) / 2
        return [centre - at_least / 2, centre + at_least / 2]
    margin = max(pad or timedelta(0), (last - first) / 50)
    return [first - margin, last + margin]


def show_range(layout: dict[str, Any], shown: list[Any]) -> None:
    """Make a time axis' automatic range include `shown`: the first drawing, the range slider and the "all"
    button all span it (a fixed range would hold for the first drawing only: "all" autoranges)."""
    layout["xaxis"]["autorangeoptions"] = {"include": shown}


@cache
def plotly_template() -> dict[str, Any]:
    """plotly's default template, as go.Figure puts it in a figure's layout (read once); none without plotly."""
    return build_figure([], {}).get("layout", {}).get("template", {})


def plotly_objects() -> Any:
    """plotly.graph_objects, or None without plotly."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    return go


def missing_figure() -> dict[str, Any]:
    """A figure drawPlotlyCharts shows as the note that plotly is not installed."""
    return {"data": [], "layout": {}, "missing": MISSING}


def build_figure(data: list[Any], layout: dict[str, Any]) -> dict[str, Any]:
    """The figure as plotly.js draws it; without plotly, the note that says so."""
    go = plotly_objects()
    if go is None:
        return missing_figure()

    return go.Figure(data=data, layout=layout).to_plotly_json()


# What json_script writes for the three characters it escapes (django.utils.html._json_script_escapes).
_SCRIPT_ESCAPES = (("&", "\\u0026"), ("<", "\\u003C"), (">", "\\u003E"))


def figure_script(figure: Any, element_id: str) -> SafeString:
    """`figure|json_script:element_id`, the same text, written faster: json_script escapes with str.translate,
    which on a 500-point figure's 115 KB of JSON cost three times its encoding (a sixth of a dataset page)."""
    text = json.dumps(figure, cls=DjangoJSONEncoder)
    for char, escaped in _SCRIPT_ESCAPES:
        text = text.replace(char, escaped)
    return format_html('<script id="{}" type="application/json">{}</script>', element_id, mark_safe(text))  # noqa: S308


def throughput_figure(snap: Any, items_url: str) -> dict[str, Any]:
    """The queue overview's attempts per minute over its window (completed and failed, stacked); a click opens
    the items list (completed: done items; failed: dead ones)."""
    go = plotly_objects()
    if go is None:
        return missing_figure()

    minutes = snap.window_minutes
    start = snap.taken_at.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    xs = [start + timedelta(minutes=i, seconds=30) for i in range(minutes)]
    traces = [
        go.Bar(
            name=name,
            x=xs,
            y=list(values),
            marker={"color": color},
            width=50_000,
            customdata=[[f"{items_url}?{urlencode({'state__exact': state})}"]] * minutes,
            hovertemplate=f"%{{x|%H:%M}} UTC: %{{y}} {name}<extra></extra>",
        )
        for name, values, color, state in (
            ("completed", snap.processed_per_minute, STATE_COLORS["succeeded"], "done"),
            ("failed", snap.failed_per_minute, STATE_COLORS["failed"], "dead"),
        )
    ]
    layout = chart_layout("", "attempts per minute", time_axis=False, barmode="stack", height=220)
    layout["xaxis"]["rangeslider"] = {"visible": True, "thickness": 0.1}
    # Room left of the first bar: a tick on the corner put its time over the y axis' "0".
    layout["xaxis"]["range"] = [start - timedelta(seconds=45), start + timedelta(minutes=minutes)]
    layout["margin"] = {"l": 60, "r": 20, "t": 10, "b": 30}
    return build_figure(traces, layout)
