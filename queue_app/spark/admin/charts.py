"""The Spark app's charts as plotly figures, on the core's chart plumbing (queue_app/admin/charts.py: plotly,
layouts, time ranges): the runs' durations and outcomes (the charts page) and the queue analytics' hourly
statistics. A click on a point opens what it stands for: a run's page, the runs of a job and state.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse
from django.utils.http import urlencode

from queue_app.admin.charts import (
    STATE_COLORS,
    build_figure,
    chart_layout,
    missing_figure,
    plotly_objects,
    show_range,
    time_range,
)

# How a run ended, as its point's symbol on the durations chart (the colour is its job's).
STATE_SYMBOLS = {"succeeded": "circle", "failed": "x", "cancelled": "square", "timed_out": "diamond"}
MIN_CATEGORIES = 5  # a bar chart of fewer categories keeps room for this many: one bar is not the chart's width


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
    layout = chart_layout("Run durations", "duration (s)")
    show_range(layout, time_range([r.finished_at for job_runs in by_job.values() for r in job_runs]))
    return build_figure(traces, layout)


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
    layout = chart_layout("Run outcomes (last finished runs)", "runs", time_axis=False, barmode="stack")
    layout["xaxis"] = {"title": {"text": "job"}, "type": "category"}
    if len(jobs) < MIN_CATEGORIES:  # room for MIN_CATEGORIES bars, the jobs' in the middle
        side = (MIN_CATEGORIES - len(jobs)) / 2
        layout["xaxis"]["range"] = [-0.5 - side, len(jobs) - 0.5 + side]
    return build_figure(traces, layout)


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
        (counts, chart_layout(f"Attempts per hour in {queue}", "attempts per hour", barmode="stack")),
        (lines, chart_layout(f"p95 per hour in {queue} (highest of its tasks)", "seconds")),
    ]
    # Hours, not milliseconds, either side of a single hour: at least six hours shown, the bars an hour wide.
    shown = time_range(centre, at_least=timedelta(hours=6), pad=timedelta(minutes=30))
    for _, layout in figures:
        show_range(layout, shown)
    return [build_figure(data, layout) for data, layout in figures]
