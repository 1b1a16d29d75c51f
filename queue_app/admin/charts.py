"""The admin's charts as plotly figures: built here in Python (plotly.graph_objects), drawn in the page by
plotly.js, which the plotly wheel carries and the admin serves itself (`plotly_js`), never a CDN.

Every chart has axes with units, hover values and a time range (range buttons and a range slider on time axes);
a click on a point opens what it stands for (`customdata[0]` is a URL: a run's page, a filtered list).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import FileResponse, Http404, HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

STATE_COLORS = {"succeeded": "#2e7d32", "failed": "#c62828", "cancelled": "#757575", "timed_out": "#ef6c00"}
# How a run ended, as its point's symbol on the durations chart (the colour is its job's).
STATE_SYMBOLS = {"succeeded": "circle", "failed": "x", "cancelled": "square", "timed_out": "diamond"}
# A time axis spans at least this much: plotly draws one point's axis as a millisecond either side of it.
MIN_TIME_SPAN = timedelta(hours=2)
MIN_CATEGORIES = 5  # a bar chart of fewer categories keeps room for this many: one bar is not the chart's width
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


def _layout(title: str, y_title: str, *, time_axis: bool = True, **extra: Any) -> dict[str, Any]:
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


def _time_range(xs: list[datetime], at_least: timedelta = MIN_TIME_SPAN, pad: timedelta | None = None) -> list[Any]:
    """A time axis' range around `xs`: at least `at_least` wide, centred on the points when they span less (one
    point, or a few close together), else the points' span with `pad` (at least 2% of it) either side."""
    first, last = min(xs), max(xs)
    if last - first < at_least:
        centre = first + (last - first) / 2
        return [centre - at_least / 2, centre + at_least / 2]
    margin = max(pad or timedelta(0), (last - first) / 50)
    return [first - margin, last + margin]


def _show_range(layout: dict[str, Any], shown: list[Any]) -> None:
    """Make a time axis' automatic range include `shown`: the first drawing, the range slider and the "all"
    button all span it (a fixed range would hold for the first drawing only: "all" autoranges)."""
    layout["xaxis"]["autorangeoptions"] = {"include": shown}


@cache
def _template() -> dict[str, Any]:
    """plotly's default template, as go.Figure puts it in a figure's layout (read once); none without plotly."""
    return _figure([], {}).get("layout", {}).get("template", {})


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


def _figure(data: list[Any], layout: dict[str, Any]) -> dict[str, Any]:
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


def run_url(run_id: int) -> str:
    return reverse("admin:jobsite_spark_sparkrun_change", args=[run_id])


def durations_figure(runs: Iterable[Any], duration_of) -> dict[str, Any] | None:
    """Seconds from start to end of finished runs against their finish time: one trace per job (its colour, in
    the legend), each point's symbol saying how the run ended (circle succeeded, x failed, square cancelled,
    diamond timed out); a click opens the run."""
    go = plotly_objects()
    if go is None:
        return missing_figure()

    by_job: dict[str, list[Any]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: r.finished_at):
        by_job[run.job].append(run)
    if not by_job:
        return None
    traces = [
        go.Scatter(
            name=job,
            x=[r.finished_at for r in job_runs],
            y=[round(duration_of(r), 3) for r in job_runs],
            mode="lines+markers",
            line={"width": 1},
            marker={"size": 9, "symbol": [STATE_SYMBOLS.get(r.state, "circle-open") for r in job_runs]},
            customdata=[[run_url(r.id), r.id, r.state] for r in job_runs],
            hovertemplate=f"<b>{job}</b> run #%{{customdata[1]}} %{{customdata[2]}}<br>"
            "%{y:.1f} s, finished %{x|%Y-%m-%d %H:%M:%S} UTC<extra></extra>",
        )
        for job, job_runs in sorted(by_job.items())
    ]
    layout = _layout("Run durations", "duration (s)")
    _show_range(layout, _time_range([r.finished_at for job_runs in by_job.values() for r in job_runs]))
    return _figure(traces, layout)


def outcomes_figure(runs: Iterable[Any], changelist_url: str) -> dict[str, Any] | None:
    """How the finished runs of each job ended (stacked counts); a click opens the runs of that job and state."""
    go = plotly_objects()
    if go is None:
        return missing_figure()

    counts = Counter((r.job, r.state) for r in runs)
    if not counts:
        return None
    jobs = sorted({job for job, _ in counts})
    traces = [
        go.Bar(
            name=state,
            x=jobs,
            y=[counts.get((job, state), 0) for job in jobs],
            marker={"color": color},
            customdata=[[f"{changelist_url}?{urlencode({'job': job, 'state': state})}"] for job in jobs],
            hovertemplate=f"%{{x}}: %{{y}} {state} run(s)<extra></extra>",
        )
        for state, color in STATE_COLORS.items()
        if any(counts.get((job, state)) for job in jobs)
    ]
    layout = _layout("Run outcomes (last finished runs)", "runs", time_axis=False, barmode="stack")
    layout["xaxis"] = {"title": {"text": "job"}, "type": "category"}
    if len(jobs) < MIN_CATEGORIES:  # room for MIN_CATEGORIES bars, the jobs' in the middle
        side = (MIN_CATEGORIES - len(jobs)) / 2
        layout["xaxis"]["range"] = [-0.5 - side, len(jobs) - 0.5 + side]
    return _figure(traces, layout)


def stats_figures(hours: dict[datetime, dict[str, Any]], queue: str) -> list[dict[str, Any]]:
    """A queue's hourly statistics: processed and failed attempts per hour (stacked bars) and the highest task
    p95 of wait and run time per hour (lines); a click opens the run that computed the hour."""
    go = plotly_objects()
    if go is None:
        return [missing_figure()]

    if not hours:
        return []
    xs = sorted(hours)
    centre = [x + timedelta(minutes=30) for x in xs]
    data = [hours[x] for x in xs]
    links = [[run_url(h["run_id"]) if h["run_id"] else "", h["run_id"] or "-"] for h in data]
    per_hour = "%{x|%Y-%m-%d %H}:00 UTC: %{y:,} {what}<br>computed by run #%{customdata[1]}<extra></extra>"
    counts = [
        go.Bar(
            name=what,
            x=centre,
            y=[h[what] for h in data],
            marker={"color": color},
            width=3_300_000,
            customdata=links,
            hovertemplate=per_hour.replace("{what}", what),
        )
        for what, color in (("processed", STATE_COLORS["succeeded"]), ("failed", STATE_COLORS["failed"]))
    ]
    lines = [
        go.Scatter(
            name=f"{what} p95",
            x=centre,
            y=[h[f"{what}_p95"] for h in data],
            mode="lines+markers",
            marker={"color": color},
            customdata=links,
            hovertemplate=f"%{{x|%Y-%m-%d %H}}:00 UTC: {what} p95 %{{y:.3f}} s<extra></extra>",
        )
        for what, color in (("wait", "#1565c0"), ("run", "#ef6c00"))
    ]
    figures = [
        (counts, _layout(f"Attempts per hour in {queue}", "attempts per hour", barmode="stack")),
        (lines, _layout(f"p95 per hour in {queue} (highest of its tasks)", "seconds")),
    ]
    # Hours, not milliseconds, either side of a single hour: at least six hours shown, the bars an hour wide.
    shown = _time_range(centre, at_least=timedelta(hours=6), pad=timedelta(minutes=30))
    for _, layout in figures:
        _show_range(layout, shown)
    return [_figure(data, layout) for data, layout in figures]


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
    layout = _layout("", "attempts per minute", time_axis=False, barmode="stack", height=220)
    layout["xaxis"]["rangeslider"] = {"visible": True, "thickness": 0.1}
    # Room left of the first bar: a tick on the corner put its time over the y axis' "0".
    layout["xaxis"]["range"] = [start - timedelta(seconds=45), start + timedelta(minutes=minutes)]
    layout["margin"] = {"l": 60, "r": 20, "t": 10, "b": 30}
    return _figure(traces, layout)


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
    layout = _layout(f"Materializations of {dataset}", kept[0])
    _show_range(layout, _time_range(x, pad=timedelta(hours=12)))
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
    layout["template"] = _template()
    if plotly_js_path() is None:
        return missing_figure()
    return {"data": traces, "layout": layout}
