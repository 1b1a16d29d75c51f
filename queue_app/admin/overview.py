"""The queue overview: a page of the admin (`/admin/queue_app/queue/overview/`), which a project may also put on
the admin's home (the jobsite project's templates/admin/index.html puts it above the app list).

Per queue: depth by state, oldest due item, in flight, processed / failed / lease expirations over the last
minutes, dead letters and live workers, what holds its due items back (a concurrency, rate or group limit),
plus a throughput chart (a plotly figure, charts.py). The page re-fetches the rendered fragment every few
seconds from `overview_fragment` and draws its chart again.
"""

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from ..flow import held_back
from ..monitoring import OVERVIEW_EXACT_UP_TO, SHOWN_STATES, snapshot
from .charts import throughput_figure

REFRESH_SECONDS = 5
WINDOW_MINUTES = 15
TEMPLATE = "admin/queue_app/overview.html"
PAGE_TEMPLATE = "admin/queue_app/overview_page.html"


def may_view(request: HttpRequest) -> bool:
    user = request.user
    return (
        user.is_active
        and user.is_staff
        and (user.has_perm("queue_app.view_queue") or user.has_perm("queue_app.change_queue"))
    )


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def changelist_link(model_name: str, **params: str) -> str:
    """URL of a queue_app change list with these filter parameters."""
    return f"{reverse(f'admin:queue_app_{model_name}_changelist')}?{urlencode(params)}"


def overview_context(request: HttpRequest) -> dict[str, Any]:
    snap = snapshot(window_minutes=WINDOW_MINUTES, cap=OVERVIEW_EXACT_UP_TO)
    holding = held_back()
    rows = []
    for q in snap.queues:
        depth = [
            (state, q.depth[state], changelist_link("queueitem", queue__name__exact=q.name, state__exact=state))
            for state in SHOWN_STATES
        ]
        rows.append(
            {
                "stats": q,
                "items_url": changelist_link("queueitem", queue__name__exact=q.name),
                "dead_letters_url": changelist_link("deadletter", item__queue__name__exact=q.name, status="open"),
                "depth": depth,
                "oldest_ready": age(q.oldest_ready_age),
                "held_back": holding.get(q.name),
            }
        )
    return {
        "snapshot": snap,
        "rows": rows,
        "states": SHOWN_STATES,
        "chart": throughput_figure(snap, reverse("admin:queue_app_queueitem_changelist")),
        "refresh_url": reverse("admin:queue_app_queue_overview_fragment"),
        "refresh_seconds": REFRESH_SECONDS,
        "workers_url": reverse("admin:queue_app_worker_changelist"),
    }


def overview_fragment(request: HttpRequest) -> TemplateResponse:
    """The overview alone (no page around it), for the landing page's periodic refresh."""
    if not may_view(request):
        raise PermissionDenied
    return TemplateResponse(request, TEMPLATE, overview_context(request))


def overview_page(request: HttpRequest) -> TemplateResponse:
    """The overview as an admin page of its own, refreshed like the fragment on a project's home."""
    if not may_view(request):
        raise PermissionDenied
    context = {**admin.site.each_context(request), "title": "Queue overview", **overview_context(request)}
    return TemplateResponse(request, PAGE_TEMPLATE, context)
