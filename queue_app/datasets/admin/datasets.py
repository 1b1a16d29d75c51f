"""Datasets in the admin (issue 38): the list (partitioning, partitions, last materialized, freshness, checks), a
dataset's page (its declaration, producers and consumers, the partition grid by state, the materialization
history as a chart of rows and bytes over time and as a table, its lineage drawn by Graphviz), the full lineage
page, and the permissioned actions: observe (datasets.services.observe) and materialize (spark.materialize, a
backfill by data, behind the Spark trigger permission), each logged.

Reads go through datasets/status.py (the same statements as `dataset list`/`show`), one statement per kind of
figure for a whole page. The rows of queue_app_dataset are the declarations' snapshots (datasets/sync.py); the
list syncs them at most once a minute per process.

Actions plug in at DATASET_TOOLS: each is a (label, URL name suffix, permission) shown on the dataset page's
object tools when the user holds it. The override of failed checks lives on Dataset check results
(admin/checks.py).
"""

from __future__ import annotations

import datetime as dt
import time
from html import escape as html_escape
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote as quote_url

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

from ...admin.actions import ReadOnlyAdmin
from ...admin.charts import figure_script
from ...spark.models import SparkTrigger
from .. import DatasetError, declared_datasets, dynamic, get_dataset
from .. import materialize as backfill
from .. import services as datasets
from ..graph import FRESHNESS_COLOURS, svg
from ..lineage import Neighbourhood
from ..models import Dataset, Materialization
from ..producer_params import parse_pairs
from ..spark_runs import lineage
from ..status import (
    PARTITIONS_COUNTED_UP_TO,
    Cell,
    Matrix,
    partition_counts,
    partition_grid,
    partition_matrix,
    summaries,
)
from ..sync import sync_datasets
from . import charts

TEMPLATES = "admin/jobsite_datasets/dataset/"
PERMISSIONS = {
    "observe": "jobsite_datasets.observe_dataset",
    "materialize": "jobsite_spark.trigger_sparkrun",
    "partitions": "jobsite_datasets.change_dynamic_partitions",
}
# The dataset page's actions: (label, URL name suffix, permission).
DATASET_TOOLS: list[tuple[str, str, str]] = [
    ("Observe", "observe", PERMISSIONS["observe"]),
    ("Materialize", "materialize", PERMISSIONS["materialize"]),
    ("Partitions", "partitions", PERMISSIONS["partitions"]),  # a dataset with a dynamic dimension only
]
HISTORY_CHART_POINTS = 500  # the chart's newest materializations
HISTORY_ROWS = 50  # the table's
PAGE_LINEAGE_DEPTH = 2  # the dataset page draws this many hops each way
LINEAGE_DEPTH = 5  # the lineage page's, unless ?depth= says otherwise (?depth=all: every hop, up to MAX_NODES)
SYNC_EVERY = 60.0
CELL_COLOURS = {
    "materialized": FRESHNESS_COLOURS["fresh"],
    "observed": ("#e1effa", "#417690"),
    "missing": FRESHNESS_COLOURS["missing"],
    "failed-checks": FRESHNESS_COLOURS["stale"],  # its latest materialization failed a blocking check
    "checks-pending": ("#fff4d6", "#c28a00"),  # its latest materialization's blocking checks still run
}
_synced_at = [0.0]


def _sync() -> None:
    if time.monotonic() - _synced_at[0] >= SYNC_EVERY:
        sync_datasets()
        _synced_at[0] = time.monotonic()


def badge(state: str, colours: dict[str, tuple[str, str]] = FRESHNESS_COLOURS) -> SafeString:
    fill, border = colours.get(state, FRESHNESS_COLOURS["unknown"])
    return format_html(
        '<span class="ds-state state-{}" style="background:{};border:1px solid {};padding:0 .4em;border-radius:3px">'
        "{}</span>",
        state,
        fill,
        border,
        state,
    )


def dataset_url(name: str) -> str:
    return reverse("admin:jobsite_datasets_dataset_change", args=[quote(name)])


def job_url(job: str) -> str:
    return reverse("admin:jobsite_spark_sparkrun_changelist") + "?" + urlencode({"job": job})


def _link_makers() -> tuple:
    """dataset_url and job_url for a whole drawing: each URL reversed once, the name put in (a thousand
    reverse() calls cost more than the rest of a 1,000-node page)."""
    marker = "DATASET-NAME-MARKER"
    datasets_at = dataset_url(marker)
    runs_at = reverse("admin:jobsite_spark_sparkrun_changelist") + "?"
    return (lambda name: datasets_at.replace(marker, quote(name))), (lambda job: runs_at + urlencode({"job": job}))


class DatasetChangeList(ChangeList):
    """The page's datasets with what the list shows of each, read for the page at once (three statements)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        declared = declared_datasets()
        known = [declared[r.name] for r in rows if r.name in declared]
        shown = {s["name"]: s for s in summaries(known, timezone.now())} if known else {}
        counts = partition_counts([r.name for r in rows]) if rows else {}
        for row in rows:
            row.summary = shown.get(row.name)
            row.partitions = counts.get(row.name, 0)
        self.result_list = rows


@admin.register(Dataset)
class DatasetAdmin(ReadOnlyAdmin):
    list_display = ("name", "partitioning", "partitions", "last_materialized", "freshness", "checks", "declared_in")
    list_filter = ("declared_in",)
    search_fields = ("name",)
    search_help_text = "Dataset name (contains)."
    ordering = ("name",)
    list_per_page = 50

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DatasetChangeList

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        _sync()
        return super().changelist_view(request, extra_context)

    def has_observe_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["observe"])

    # -- list columns -----------------------------------------------------------------------------------------

    @admin.display(description="partitioning")
    def partitioning(self, row: Dataset) -> str:
        return _partitioning(row.config.get("partitioning"), short=True)

    @admin.display(description="partitions")
    def partitions(self, row: Dataset) -> str:
        n = getattr(row, "partitions", 0)
        return f"{PARTITIONS_COUNTED_UP_TO:,}+" if n > PARTITIONS_COUNTED_UP_TO else f"{n:,}"

    @admin.display(description="last materialized")
    def last_materialized(self, row: Dataset) -> Any:
        return _when((getattr(row, "summary", None) or {}).get("last_materialized"))

    @admin.display(description="freshness")
    def freshness(self, row: Dataset) -> SafeString:
        summary = getattr(row, "summary", None)
        return badge(summary["freshness"]) if summary else format_html('<span class="quiet">{}</span>', "not declared")

    @admin.display(description="checks")
    def checks(self, row: Dataset) -> str:
        return (getattr(row, "summary", None) or {}).get("checks", "none")

    # -- URLs and views ---------------------------------------------------------------------------------------

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("<str:name>/lineage/", view(self.lineage_view), name=self.url_name("lineage")),
            path("<str:name>/observe/", view(self.observe_view), name=self.url_name("observe")),
            path("<str:name>/materialize/", view(self.materialize_view), name=self.url_name("materialize")),
            path("<str:name>/partitions/", view(self.partitions_view), name=self.url_name("partitions")),
            *super().get_urls(),
        ]

    def reverse(self, suffix: str, *args: Any) -> str:
        return reverse(f"{self.admin_site.name}:{self.url_name(suffix)}", args=args)

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "changelist_url": self.reverse("changelist"),
            **extra,
        }

    def _declared(self, request: HttpRequest, name: str):
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            return get_dataset(name)
        except DatasetError:
            raise Http404(f"no declared dataset {name!r}") from None

    def _lineage(self, name: str, depth: int | None, graph: Any = None) -> tuple[Neighbourhood, SafeString]:
        seen = (graph if graph is not None else lineage()[1]).neighbourhood(name, depth)
        declared = declared_datasets()
        known = [declared[n] for n in seen.datasets if n in declared]
        shown = {s["name"]: s for s in summaries(known, timezone.now())}
        to_dataset, to_job = _link_makers()
        drawing = svg(seen, shown, dataset_url=to_dataset, job_url=to_job)
        return seen, mark_safe(drawing)  # noqa: S308  dot's own SVG, labels escaped by it

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        if request.method == "POST":
            raise PermissionDenied  # the page has no form of its own: its actions have their own pages
        ds = self._declared(request, unquote(object_id))
        partition = request.GET.get("partition")
        history = Materialization.objects.filter(dataset=ds.name)
        if partition is not None:
            history = history.filter(partition=partition)
        newest = _history_rows(history.order_by("-at", "-id")[:HISTORY_CHART_POINTS])
        try:
            page = max(1, int(request.GET.get("hp") or 1))
        except ValueError:
            page = 1
        first = (page - 1) * HISTORY_ROWS
        if first + HISTORY_ROWS < len(newest) or len(newest) < HISTORY_CHART_POINTS:
            rows = newest[first : first + HISTORY_ROWS + 1]
        else:  # past the chart's points: that page read by itself (materialization_latest, an offset into it)
            rows = _history_rows(history.order_by("-at", "-id")[first : first + HISTORY_ROWS + 1])
        users, graph = lineage()  # once: its key over 10,000 jobs is read in a few ms
        jobs = users.get(ds.name, {})
        summary = summaries([ds], timezone.now())[0]
        seen, drawing = self._lineage(ds.name, PAGE_LINEAGE_DEPTH, graph)
        figure = charts.materializations_figure(newest, ds.name)
        context = self._context(
            request,
            ds.name,
            ds=ds,
            summary=summary,
            last_materialized=_when(summary["last_materialized"]),
            freshness=badge(summary["freshness"]),
            partitioning=_partitioning(ds.partitioning.describe()),
            producers=[(job, job_url(job)) for job in sorted(jobs.get("producers", []))],
            consumers=[(job, job_url(job)) for job in sorted(jobs.get("consumers", []))],
            grid=_grid(ds, partition),
            cell_states=[(state, badge(state, CELL_COLOURS)) for state in CELL_COLOURS],
            freshness_states=[(state, badge(state)) for state in FRESHNESS_COLOURS],
            partition=partition,
            history=rows[:HISTORY_ROWS],
            history_page=page,
            history_newer=_page_query(request, page - 1) if page > 1 else None,
            history_older=_page_query(request, page + 1) if len(rows) > HISTORY_ROWS else None,
            figure=figure,
            figure_script=figure_script(figure, "ds-figure") if figure else "",
            lineage=drawing,
            neighbourhood=seen,
            lineage_depth=PAGE_LINEAGE_DEPTH,
            lineage_url=self.reverse("lineage", ds.name),
            tools=[
                (label, self.reverse(suffix, ds.name))
                for label, suffix, permission in DATASET_TOOLS
                if request.user.has_perm(permission) and (suffix != "partitions" or dynamic.sets_of(ds))
            ],
        )
        return TemplateResponse(request, TEMPLATES + "detail.html", context)

    def lineage_view(self, request: HttpRequest, name: str) -> HttpResponse:
        ds = self._declared(request, name)
        asked = request.GET.get("depth") or ""
        try:
            depth = None if asked == "all" else int(asked) if asked else LINEAGE_DEPTH
        except ValueError:
            depth = LINEAGE_DEPTH
        depth = depth if depth is None or depth >= 1 else 1
        seen, drawing = self._lineage(ds.name, depth)
        context = self._context(
            request,
            f"Lineage of {ds.name}",
            ds=ds,
            lineage=drawing,
            neighbourhood=seen,
            depth=depth,
            depths=[1, 2, 3, 5, 10],
            dataset_url=dataset_url(ds.name),
        )
        return TemplateResponse(request, TEMPLATES + "lineage.html", context)

    def partitions_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """The keys of the dataset's dynamic partition sets, with their history; adding and removing them needs
        jobsite_datasets.change_dynamic_partitions (logged)."""
        ds = self._declared(request, name)
        sets = dynamic.sets_of(ds)
        if not sets:
            raise Http404(f"dataset {ds.name!r} has no dynamic partitions")
        allowed = request.user.has_perm(PERMISSIONS["partitions"])
        form = DynamicKeysForm(request.POST or None, sets=[p.name for _n, p in sets])
        if request.method == "POST":
            if not allowed:
                raise PermissionDenied
            if form.is_valid():
                verb, partition_set = form.cleaned_data["verb"], form.cleaned_data["partition_set"]
                change = dynamic.add_keys if verb == "add" else dynamic.remove_keys
                try:
                    done = change(partition_set, form.cleaned_data["keys"].split(), by=f"admin:{request.user}")
                except DatasetError as exc:
                    form.add_error("keys", str(exc))
                else:
                    what = f"{'Added' if verb == 'add' else 'Removed'} {partition_set}: {', '.join(done) or 'nothing'}"
                    LogEntry.objects.log_actions(
                        user_id=request.user.pk,
                        queryset=Dataset.objects.filter(pk=ds.name),
                        action_flag=CHANGE,
                        change_message=what,
                    )
                    self.message_user(request, what, messages.SUCCESS)
                    return HttpResponseRedirect(self.reverse("partitions", ds.name))
        listed = [(p.name, dynamic.list_keys(p.name, history=True)) for _n, p in sets]
        context = self._context(
            request,
            f"Partitions of {ds.name}",
            ds=ds,
            form=form if allowed else None,
            listed=listed,
            dataset_url=dataset_url(ds.name),
        )
        return TemplateResponse(request, TEMPLATES + "partitions.html", context)

    def observe_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_observe_permission(request):
            raise PermissionDenied
        ds = self._declared(request, name)
        form = ObserveForm(request.POST or None, partitioned=ds.partitioning.kind != "none")
        if request.method == "POST" and form.is_valid():
            try:
                recorded = datasets.observe(ds.name, form.cleaned_data.get("partition") or None)
            except DatasetError as exc:
                form.add_error("partition" if "partition" in form.fields else None, str(exc))
            else:
                what = f"Observed {ds.name}[{recorded.partition or '-'}]" + (
                    f": {recorded.files} files, {recorded.bytes} bytes" if recorded.files is not None else ""
                )
                LogEntry.objects.log_actions(
                    user_id=request.user.pk,
                    queryset=Dataset.objects.filter(pk=ds.name),
                    action_flag=CHANGE,
                    change_message=what,
                )
                self.message_user(request, what, messages.SUCCESS)
                return HttpResponseRedirect(dataset_url(ds.name))
        context = self._context(request, f"Observe {ds.name}", ds=ds, form=form, dataset_url=dataset_url(ds.name))
        return TemplateResponse(request, TEMPLATES + "observe.html", context)

    def materialize_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not request.user.has_perm(PERMISSIONS["materialize"]):
            raise PermissionDenied
        ds = self._declared(request, name)
        posted = request.POST if request.method == "POST" else None  # an unpartitioned dataset's form is empty
        form = MaterializeForm(posted, partitioned=ds.partitioning.kind != "none")
        if request.method == "POST" and form.is_valid():
            given = {k: form.cleaned_data.get(k) or None for k in ("partition", "start", "end")}
            try:
                result = backfill.materialize(
                    ds.name,
                    **given,
                    missing_only=form.cleaned_data["missing_only"],
                    params=form.cleaned_data["params"],
                    requested_by=f"admin: {request.user.get_username()}",
                    trigger=SparkTrigger.DASHBOARD,
                )
            except DatasetError as exc:
                form.add_error(None, str(exc))
            else:
                started = [f"runs {', '.join(map(str, result['runs']))}"] if result["runs"] else []
                started += [f"items {', '.join(map(str, result['items']))}"] if result["items"] else []
                what = f"Materialize {ds.name}: {len(result['partitions'])} partitions, " + (
                    ", ".join(started) or "runs (none: nothing to do)"
                )
                LogEntry.objects.log_actions(
                    user_id=request.user.pk,
                    queryset=Dataset.objects.filter(pk=ds.name),
                    action_flag=CHANGE,
                    change_message=what,
                )
                self.message_user(request, what, messages.SUCCESS)
                return HttpResponseRedirect(dataset_url(ds.name))
        context = self._context(request, f"Materialize {ds.name}", ds=ds, form=form, dataset_url=dataset_url(ds.name))
        return TemplateResponse(request, TEMPLATES + "materialize.html", context)


class MaterializeForm(forms.Form):
    partition = forms.CharField(max_length=200, required=False, help_text="One partition's key.")
    start = forms.CharField(max_length=200, required=False, label="From", help_text="The first of a range.")
    end = forms.CharField(max_length=200, required=False, label="To", help_text="The last of a range (included).")
    missing_only = forms.BooleanField(
        required=False, help_text="Only partitions never materialized or whose latest failed a blocking check."
    )
    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="The producer's parameters, one NAME=VALUE a line: over the dataset's declared params and the "
        "partition.",
    )

    def __init__(self, *args: Any, partitioned: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not partitioned:
            for name in ("partition", "start", "end"):
                del self.fields[name]

    def clean_params(self) -> dict[str, str]:
        lines = [line.strip() for line in self.cleaned_data["params"].splitlines() if line.strip()]
        try:
            return parse_pairs(lines, option="a parameter")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


class DynamicKeysForm(forms.Form):
    verb = forms.ChoiceField(choices=[("add", "Add"), ("remove", "Remove")])
    partition_set = forms.ChoiceField(label="set")
    keys = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=100_000,
        help_text="Keys separated by spaces or lines: 1-100 letters, digits, '_', '.', '=' or '-'.",
    )

    def __init__(self, *args: Any, sets: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["partition_set"].choices = [(name, name) for name in sets]


class ObserveForm(forms.Form):
    partition = forms.CharField(
        max_length=200, help_text="The partition's key (a day 2026-11-26, an hour 2026-11-26T05, a static key)."
    )

    def __init__(self, *args: Any, partitioned: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not partitioned:
            del self.fields["partition"]


def _grid(ds: Any, selected: str | None) -> SafeString:
    matrix = partition_matrix(ds)
    return matrix_html(matrix, selected) if matrix is not None else grid_html(partition_grid(ds), selected)


def matrix_html(matrix: Matrix, selected: str | None) -> SafeString:
    """A multi-dimension dataset's grid as a table: a row per time key (gap and older rows span the table), a
    column per key of the other dimensions. Written with plain escaped strings, not format_html per cell: a
    60 x 50 matrix is 3,000 links."""
    # (html.escape is django's escape without its lazy-string wrapper: the same text, a third of the cost per cell)
    head = f"<th>{html_escape(matrix.time_dimension)}</th>" + "".join(
        f"<th>{html_escape(c)}</th>" for c in matrix.columns
    )
    # per state, a cell's link's class (its slot for " selected") and colours
    looks = {state: f'class="state-{state}{{}}" style="background:{fill};border:1px solid {border}"' for state, (
        fill, border) in CELL_COLOURS.items()}  # fmt: skip
    cells_of, key_of = matrix.cells.get, matrix.key
    body = []
    for row in matrix.rows:
        if row.state in ("gap", "older"):
            what = "never materialized" if row.state == "gap" else "older, none failed its checks"
            first, until = html_escape(row.partition), html_escape(row.until)
            body.append(
                f'<tr class="state-{row.state}"><th>… {row.count} …</th><td colspan="{len(matrix.columns)}" '
                f'title="{first} to {until}: {what}">{first} to {until}</td></tr>'
            )
            continue
        cells = []
        for column in matrix.columns:
            c = cells_of((row.partition, column))
            if c is None:
                key, state = key_of(row.partition, column), "missing"
                title = f"{key}: missing"
            else:
                key, state = c.partition, c.state
                title = f"{key}: {state}" if c.rows is None else f"{key}: {state}, {c.rows} rows"
            look = looks[state].format(" selected" if selected == key else "")
            cells.append(
                f'<td><a href="?partition={quote_url(key, safe="")}" {look} title="{html_escape(title)}">·</a></td>'
            )
        body.append(f"<tr><th>{html_escape(row.partition)}</th>{''.join(cells)}</tr>")
    more = f'<p class="quiet">and {matrix.more_columns} more keys</p>' if matrix.more_columns else ""
    return mark_safe(  # noqa: S308  every value escaped above
        f'<table class="ds-matrix"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}'
    )


def grid_html(cells: list[Cell], selected: str | None) -> SafeString:
    """The partition grid's cells as HTML, written here rather than by the template (200 cells through the
    template language, each with a localized time, were half of the dataset page)."""
    parts = []
    for c in cells:
        if c.state in ("gap", "older"):  # a run of partitions in one cell, not a link
            what = "never materialized" if c.state == "gap" else "older, none failed its checks"
            parts.append(
                format_html(
                    '<span class="state-{}" title="{} to {}: {} partitions, {}">… {} {} …</span>',
                    c.state,
                    c.partition,
                    c.until,
                    c.count,
                    what,
                    c.count,
                    "missing" if c.state == "gap" else "older",
                )
            )
            continue
        fill, border = CELL_COLOURS[c.state]
        title = f"{c.partition or '(unpartitioned)'}: {c.state}"
        if c.at is not None:
            title += f" at {c.at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
        if c.rows is not None:
            title += f", {c.rows} rows"
        parts.append(
            format_html(
                '<a href="?partition={}" class="state-{}{}" style="background:{};border:1px solid {}" '
                'title="{}">{}</a>',
                quote_url(c.partition, safe="/"),
                c.state,
                " selected" if selected == c.partition else "",
                fill,
                border,
                title,
                c.partition or "unpartitioned",
            )
        )
    return mark_safe("".join(parts))  # noqa: S308  every part escaped by format_html


# What the chart and the history table show of a materialization.
HISTORY_FIELDS = ("id", "partition", "at", "rows", "bytes", "files", "source", "spark_run_id", "workflow_step_id",
                  "item_id", "checks")  # fmt: skip


def _history_rows(query: Any) -> list[SimpleNamespace]:
    """The materializations the page shows, as plain rows of HISTORY_FIELDS: 500 model instances (their init
    signals, their metadata's JSON parsed) cost a tenth of the page."""
    return [SimpleNamespace(**row) for row in query.values(*HISTORY_FIELDS)]


def _page_query(request: HttpRequest, page: int) -> str:
    """The page's query string with the history table's page `page`."""
    query = request.GET.copy()
    query["hp"] = str(page)
    return "?" + query.urlencode()


def _when(iso: str | None) -> Any:
    """A summary's ISO time as a datetime (the admin formats it like any other), or "never"."""
    return dt.datetime.fromisoformat(iso) if iso else "never"


STATIC_KEYS_LISTED = 3  # a static set of more keys is shown by its count in the list's column


def _partitioning(described: Any, *, short: bool = False) -> str:
    """How a dataset is partitioned, in words; `short` (the list's column, which must fit the page at 1,440 px):
    several dimensions by their names, a static set of more than a few keys by its count."""
    if isinstance(described, dict) and "dimensions" in described:
        if short:  # the dimensions' names: each one's partitioning is on the dataset's page
            return " × ".join(d["name"] for d in described["dimensions"])
        return " × ".join(f"{d['name']} ({_partitioning(d['partitioning'])})" for d in described["dimensions"])
    if isinstance(described, dict) and "dynamic" in described:
        return f"dynamic ({described['dynamic']})"
    if isinstance(described, dict):
        keys = [str(k) for k in described.get("static", [])]
        if short and len(keys) > STATIC_KEYS_LISTED:
            return f"static, {len(keys)} keys"
        return "static " + ", ".join(keys)
    return described or "unpartitioned"
