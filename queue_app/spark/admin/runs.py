"""The Spark dashboard, inside the admin: runs (list with live progress, filters by job and state), a run's page
(live progress bars, log tail, metrics, error, Spark UI link, cancel and re-run), the trigger page (one form per
registered job, built from its declared parameters), and charts (run durations per job; the queue-analytics
output, QueueStatsHourly, per hour for a chosen queue).

Rows change only through queue_app/spark/runs.py (trigger_run, cancel_run, rerun), behind the custom permissions
trigger_sparkrun and cancel_sparkrun; viewing needs view_sparkrun. Live parts re-fetch a small fragment (the run
page) or JSON (the list) every second or two and stop once the run is final. Charts are plotly figures (this app's
charts.py, on the core's chart plumbing), like the queue overview's.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from queue_app.admin.actions import Operation, ReadOnlyAdmin
from queue_app.admin.display import cut, shorten, time_column
from queue_app.admin.overview import age
from queue_app.hooks import why_held
from queue_app.spark import all_jobs, eventlog, get_job
from queue_app.spark.forms import SparkRunForm
from queue_app.spark.models import SPARK_FINAL_STATES as SPARK_FINAL
from queue_app.spark.models import QueueStatsHourly, SparkConnectServer, SparkRun, SparkRunState
from queue_app.spark.registry import SparkParamError, UnknownSparkJob
from queue_app.spark.runs import cancel_run, rerun, timing_split, trigger_run, triggered, waiting_for

from . import charts

PERMISSIONS = {"trigger": "jobsite_spark.trigger_sparkrun", "cancel": "jobsite_spark.cancel_sparkrun"}
LIVE_SECONDS = 1  # the run page's refresh
LIST_LIVE_SECONDS = 2  # the run list's refresh
CHART_RUNS = 200  # finished runs in the durations chart
STATS_HOURS = 48  # hours of QueueStatsHourly in the analytics charts
TEMPLATES = "admin/jobsite_spark/spark/"

CANCEL = Operation(
    name="cancel_runs",
    label="Cancel",
    done="Asked {n} {noun} to stop",
    permission="cancel",
    eligible=lambda qs: qs.exclude(state__in=[*SPARK_FINAL, SparkRunState.CANCELLING]),
    eligible_label="queued, starting or running",
    apply=lambda pks, actor: sum(cancel_run(pk, actor=actor) for pk in pks),
)


def progress_of(run: SparkRun) -> dict[str, Any]:
    """Done/total bars of a run's last progress event (jobs, stages, tasks) and the tasks' percentage."""
    p = run.progress or {}
    bars = []
    for kind in ("jobs", "stages", "tasks"):
        done, total = int(p.get(f"{kind}_done") or 0), int(p.get(f"{kind}_total") or 0)
        bars.append({"kind": kind, "done": done, "total": total, "pct": round(100 * done / total) if total else 0})
    tasks = bars[2]
    pct = 100 if run.state == SparkRunState.SUCCEEDED else tasks["pct"]
    return {"bars": bars, "pct": pct, "label": f"{tasks['done']}/{tasks['total']} tasks" if tasks["total"] else ""}


def connect_servers() -> list[dict[str, Any]]:
    """jobsite's Spark Connect servers and their health as their supervisors last wrote it (warm runs)."""
    from queue_app.spark import connect
    from queue_app.spark.connect_health import STALE_AFTER

    try:
        configured = str(connect.configured() or "")
    except connect.ConnectConfigError as exc:
        configured = f"invalid: {exc}"
    now = timezone.now()
    return [
        {
            "server": server,
            "used": str(server.url) == configured,
            "fresh": bool(server.last_heartbeat and now - server.last_heartbeat <= STALE_AFTER),
        }
        for server in SparkConnectServer.objects.order_by("id")
    ] or ([{"server": None, "configured": configured}] if configured else [])


def duration_of(run: SparkRun) -> float | None:
    if run.started_at is None:
        return None
    return ((run.finished_at or timezone.now()) - run.started_at).total_seconds()


def live_state(run: SparkRun) -> dict[str, Any]:
    progress = progress_of(run)
    return {
        "state": run.state,
        "final": run.is_final,
        "pct": progress["pct"],
        "label": progress["label"],
        "duration": age(duration_of(run)),
    }


# -- charts ---------------------------------------------------------------------------------------------------


def finished_runs() -> list[SparkRun]:
    return list(
        SparkRun.objects.filter(state__in=SPARK_FINAL, started_at__isnull=False, finished_at__isnull=False)
        .order_by("-id")
        .only("id", "job", "state", "started_at", "finished_at")[:CHART_RUNS]
    )


def stats_hours(queue: str | None) -> dict[str, Any]:
    """The chosen queue's last STATS_HOURS hours of QueueStatsHourly, summed over its tasks (processed, failed)
    with the highest task p95 of wait and of run time per hour, and the run that computed each hour."""
    queues = list(QueueStatsHourly.objects.order_by("queue").values_list("queue", flat=True).distinct())
    if not queues:
        return {"queues": [], "queue": None, "figures": [], **last_analytics()}
    queue = queue if queue in queues else queues[0]
    last = QueueStatsHourly.objects.filter(queue=queue).order_by("-hour").values_list("hour", flat=True).first()
    hours: dict[datetime, dict[str, Any]] = {}
    for row in QueueStatsHourly.objects.filter(queue=queue, hour__gte=last - timedelta(hours=STATS_HOURS - 1)).values(
        "hour", "processed", "failed", "wait_p95", "run_p95", "run_id"
    ):
        h = hours.setdefault(
            row["hour"], {"processed": 0, "failed": 0, "wait_p95": None, "run_p95": None, "run_id": None}
        )
        h["processed"] += row["processed"]
        h["failed"] += row["failed"]
        h["run_id"] = max(h["run_id"] or 0, row["run_id"] or 0) or None
        for key in ("wait_p95", "run_p95"):
            if row[key] is not None:
                h[key] = max(row[key], h[key] or 0.0)
    figures = zip(("processed", "p95"), charts.stats_figures(hours, queue), strict=False)
    return {"queues": queues, "queue": queue, "figures": [(n, f"figure-{n}", f) for n, f in figures]}


def last_analytics() -> dict[str, Any]:
    """What the last finished queue_analytics run did, for a page with no statistics to chart: that it ran, how
    it ended, the range it read (its metrics; a run that did not succeed: its parameters' window) and the
    attempts it found there."""
    from queue_app.spark.pipelines.queue_analytics import window

    run = SparkRun.objects.filter(job="queue_analytics", state__in=SPARK_FINAL).order_by("-id").first()
    if run is None:
        return {"last_run": None}
    metrics = run.metrics or {}
    if metrics.get("since") and metrics.get("until"):
        since, until = (datetime.fromisoformat(metrics[key]) for key in ("since", "until"))
    else:
        try:
            days = {key: date.fromisoformat(run.params[key]) for key in ("since", "until") if run.params.get(key)}
            since, until = window(days) if days else (None, None)  # an incremental run: since its watermark
        except (TypeError, ValueError):
            since, until = None, None
    span = f"{since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M} UTC" if since and until else ""
    return {"last_run": run, "range": span, "attempts": metrics.get("attempts", 0), "error": shorten(run.error)}


class JobFilter(admin.SimpleListFilter):
    """The registered jobs (from the registry: no DISTINCT over the runs table)."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request, model_admin):
        return [(spark_job.name, spark_job.name) for spark_job in all_jobs()]

    def queryset(self, request, queryset):
        return queryset.filter(job=self.value()) if self.value() else queryset


# -- the ModelAdmin -------------------------------------------------------------------------------------------


class SparkRunAdmin(ReadOnlyAdmin):
    operations = (CANCEL,)
    actions = [op.as_action() for op in operations]
    list_display = (
        "id",
        "job",
        "state_badge",
        "progress_bar",
        "duration",
        "trigger",
        "requested",
        "params_short",
        "attempt",
        "queued",
    )
    list_display_links = ("id", "job")
    list_filter = (JobFilter, "state", "trigger")
    search_fields = ("=id", "=job", "=app_id")
    search_help_text = "Exact run id, job name or Spark application id."
    change_list_template = TEMPLATES + "run_list.html"
    list_per_page = 50

    # -- permissions ------------------------------------------------------------------------------------------

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["cancel"])

    def has_trigger_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["trigger"])

    # -- list columns -----------------------------------------------------------------------------------------

    @admin.display(description="state", ordering="state")
    def state_badge(self, run: SparkRun) -> SafeString:
        return format_html('<span class="spark-state state-{}" data-run="{}">{}</span>', run.state, run.id, run.state)

    @admin.display(description="progress")
    def progress_bar(self, run: SparkRun) -> SafeString:
        p = progress_of(run)
        return format_html(
            '<span class="spark-bar" data-run="{}"><progress max="100" value="{}"></progress> '
            '<span class="spark-bar-label">{}</span></span>',
            run.id,
            p["pct"],
            p["label"],
        )

    @admin.display(description="duration")
    def duration(self, run: SparkRun) -> SafeString:
        return format_html('<span class="spark-duration" data-run="{}">{}</span>', run.id, age(duration_of(run)))

    @admin.display(description="params")
    def params_short(self, run: SparkRun) -> SafeString | str:
        return cut(", ".join(f"{k}={v}" for k, v in (run.params or {}).items()))

    @admin.display(description="requested by", ordering="requested_by")
    def requested(self, run: SparkRun) -> SafeString | str:
        return cut(run.requested_by, "narrow")

    queued = time_column("queued_at", "queued at", ordering="queued_at")

    # -- URLs and views ---------------------------------------------------------------------------------------

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("trigger/", view(self.trigger_view), name=self.url_name("trigger")),
            path("charts/", view(self.charts_view), name=self.url_name("charts")),
            path("live/", view(self.list_live_view), name=self.url_name("list_live")),
            path("<int:run_id>/live/", view(self.live_view), name=self.url_name("live")),
            path("<int:run_id>/cancel/", view(require_POST(self.cancel_view)), name=self.url_name("cancel")),
            path("<int:run_id>/rerun/", view(require_POST(self.rerun_view)), name=self.url_name("rerun")),
            *super().get_urls(),
        ]

    def reverse(self, suffix: str, *args: Any) -> str:
        return reverse(f"{self.admin_site.name}:{self.url_name(suffix)}", args=args)

    def object_tool_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        links = [("Charts", self.reverse("charts"))]
        if self.has_trigger_permission(request):
            links.insert(0, ("Trigger a run", self.reverse("trigger")))
        return [*links, *super().object_tool_links(request)]

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "may_trigger": self.has_trigger_permission(request),
            "may_cancel": self.has_cancel_permission(request),
            "changelist_url": self.reverse("changelist"),
            "trigger_url": self.reverse("trigger"),
            "charts_url": self.reverse("charts"),
            **extra,
        }

    def _log(self, request: HttpRequest, run: SparkRun, flag: int, message: str) -> None:
        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=SparkRun.objects.filter(pk=run.pk),
            action_flag=flag,
            change_message=message,
        )

    def _run_context(self, request: HttpRequest, run: SparkRun) -> dict[str, Any]:
        return {
            "run": run,
            "progress": progress_of(run),
            "duration": age(duration_of(run)),
            "live_url": self.reverse("live", run.id),
            "cancel_url": self.reverse("cancel", run.id),
            "rerun_url": self.reverse("rerun", run.id),
            "item_url": reverse("admin:queue_app_queueitem_change", args=[run.item_id]) if run.item_id else "",
            "may_trigger": self.has_trigger_permission(request),
            "may_cancel": self.has_cancel_permission(request),
            "cancellable": run.state not in SPARK_FINAL and run.state != SparkRunState.CANCELLING,
            "refresh_seconds": LIVE_SECONDS,
            "event_log": eventlog.log_for(run.id, run.app_id) if run.app_id else None,
            "waiting_for": waiting_for(run),
            "blocked": why_held([run.item_id]).get(run.item_id, "")
            if run.state == SparkRunState.QUEUED and run.item_id
            else "",
            "triggered": triggered(run),
            "timings": timing_split(run),
        }

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        self._require_view(request)
        if request.method == "POST":  # the run page has no form of its own: buttons post to their own URLs
            raise PermissionDenied
        try:
            run = SparkRun.objects.get(pk=int(object_id))
        except (ValueError, SparkRun.DoesNotExist):
            raise Http404(f"no Spark run {object_id!r}") from None
        context = self._context(request, f"{run.job} run #{run.id}", **self._run_context(request, run))
        context["original"] = run
        return TemplateResponse(request, TEMPLATES + "run_detail.html", context)

    def live_view(self, request: HttpRequest, run_id: int) -> HttpResponse:
        """The live part of a run's page (state, bars, log tail, metrics, buttons), re-fetched by the page."""
        self._require_view(request)
        run = get_object_or_404(SparkRun, pk=run_id)
        return TemplateResponse(request, TEMPLATES + "run_live.html", self._run_context(request, run))

    def list_live_view(self, request: HttpRequest) -> JsonResponse:
        """{run id: state, percentage, label, duration, final} for the ids the run list still shows live."""
        self._require_view(request)
        ids = [int(i) for i in request.GET.get("ids", "").split(",") if i.strip().isdigit()][:200]
        runs = SparkRun.objects.filter(id__in=ids).only(
            "id", "state", "progress", "started_at", "finished_at", "job", "params"
        )
        return JsonResponse({str(run.id): live_state(run) for run in runs})

    def cancel_view(self, request: HttpRequest, run_id: int) -> HttpResponse:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        run = get_object_or_404(SparkRun, pk=run_id)
        if cancel_run(run.id, actor=request.user.get_username()):
            self._log(request, run, CHANGE, "Asked the run to stop (cancel)")
            self.message_user(request, f"Run #{run.id}: cancel requested.", messages.SUCCESS)
        else:
            self.message_user(request, f"Run #{run.id} is {run.state}: nothing to cancel.", messages.WARNING)
        return HttpResponseRedirect(self.reverse("change", run.id))

    def rerun_view(self, request: HttpRequest, run_id: int) -> HttpResponse:
        if not self.has_trigger_permission(request):
            raise PermissionDenied
        old = get_object_or_404(SparkRun, pk=run_id)
        try:
            run = rerun(old.id, actor=request.user.get_username())
        except (SparkParamError, UnknownSparkJob) as exc:  # the job or its parameters changed since
            self.message_user(request, f"Cannot re-run #{old.id}: {exc}", messages.ERROR)
            return HttpResponseRedirect(self.reverse("change", old.id))
        self._log(request, run, ADDITION, f"Re-run of run #{old.id}")
        self.message_user(request, f"Run #{run.id} queued (re-run of #{old.id}).", messages.SUCCESS)
        return HttpResponseRedirect(self.reverse("change", run.id))

    def trigger_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        may_trigger = self.has_trigger_permission(request)
        posted_job = None
        if request.method == "POST":
            if not may_trigger:
                raise PermissionDenied
            posted_job = request.POST.get("job", "")
            try:
                get_job(posted_job)
            except UnknownSparkJob as exc:  # a forged or stale form: say so on the page, queue nothing
                self.message_user(request, f"Nothing was queued: {exc}.", messages.ERROR)
                posted_job = None
        forms = []
        for spark_job in all_jobs():
            if spark_job.name == posted_job:
                form = SparkRunForm(spark_job, request.POST)
                if form.is_valid():
                    try:
                        run = trigger_run(
                            spark_job.name,
                            form.params(),
                            trigger="dashboard",
                            requested_by=request.user.get_username(),
                            timeout=form.cleaned_data.get("timeout"),
                        )
                    except SparkParamError as exc:  # e.g. an input path removed since the form was checked
                        form.add_param_errors(exc)
                    else:
                        self._log(request, run, ADDITION, f"Triggered {run.job} from the dashboard")
                        self.message_user(request, f"Run #{run.id} of {run.job} queued.", messages.SUCCESS)
                        return HttpResponseRedirect(self.reverse("change", run.id))
            else:
                form = SparkRunForm(spark_job)
            forms.append({"job": spark_job, "form": form, "open": spark_job.name == posted_job})
        context = self._context(request, "Trigger a Spark run", job_forms=forms, may_trigger=may_trigger)
        status = 400 if request.method == "POST" else 200  # a POST that comes back here had errors
        return TemplateResponse(request, TEMPLATES + "trigger.html", context, status=status)

    def charts_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        runs = finished_runs()
        figures = {
            "durations": charts.durations_figure(runs, duration_of),
            "outcomes": charts.outcomes_figure(runs, self.reverse("changelist")),
        }
        context = self._context(
            request,
            "Spark charts",
            figures=[(name, f"figure-{name}", figure) for name, figure in figures.items() if figure],
            stats=stats_hours(request.GET.get("queue")),
        )
        return TemplateResponse(request, TEMPLATES + "charts.html", context)

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        extra = {
            "list_live_url": self.reverse("list_live"),
            "refresh_seconds": LIST_LIVE_SECONDS,
            "connect_servers": connect_servers(),
        }
        return super().changelist_view(request, {**extra, **(extra_context or {})})


admin.site.register(SparkRun, SparkRunAdmin)
