"""Queues: their options and flow control (edited through services.set_queue_options), pause and resume
(permission pause_queue), and the URL of the overview fragment the landing page refreshes from."""

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import services
from ..flow import format_rate
from ..models import Queue
from .actions import Operation, OperationsAdmin
from .charts import plotly_js
from .overview import changelist_link, overview_fragment, overview_page

OPTIONS = ("concurrency_limit", "lease_timeout", "max_attempts", "retention")
FLOW_OPTIONS = ("rate_limit", "rate_period", "group_concurrency", "fair", "group_weights", "aging_rate")
RATE = ("rate_limit", "rate_period")  # set together: a rate limit is N leases per period

PAUSE = Operation(
    name="pause",
    label="Pause",
    done="Paused {n} {noun}",
    permission="pause",
    eligible=lambda qs: qs.filter(paused=False),
    eligible_label="running",
    apply=lambda names, actor: sum(services.pause_queue(name, actor=actor) for name in names),
)
RESUME = Operation(
    name="resume",
    label="Resume",
    done="Resumed {n} {noun}",
    permission="pause",
    eligible=lambda qs: qs.filter(paused=True),
    eligible_label="paused",
    apply=lambda names, actor: sum(services.resume_queue(name, actor=actor) for name in names),
)


def _at_least_one(name: str, *, required: bool) -> forms.IntegerField:
    """An integer field whose browser-side minimum (min="1") is the minimum services enforces, with its words."""
    must = services.QUEUE_OPTION_RULES[name][1]
    return forms.IntegerField(
        min_value=1,
        required=required,
        label=Queue._meta.get_field(name).verbose_name.capitalize(),
        help_text=Queue._meta.get_field(name).help_text,
        error_messages={"min_value": f"Must be {must}.", "invalid": f"Must be {must}."},
    )


class QueueForm(forms.ModelForm):
    """A queue's options, refused per field when the queue could not run with them (services decides)."""

    concurrency_limit = _at_least_one("concurrency_limit", required=False)
    max_attempts = _at_least_one("max_attempts", required=True)

    class Meta:
        help_texts = {"retention": 'How long done items are kept before pruning: days hh:mm:ss ("7 00:00:00").'}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for name, message in services.queue_option_errors(**self.changed_options(data)).items():
            if name not in self.errors:
                self.add_error(name, message)
        return data

    def changed_options(self, data: dict[str, Any]) -> dict[str, Any]:
        """The options this form changes, a rate limit always with its period (the services set them together)."""
        names = [name for name in (*OPTIONS, *FLOW_OPTIONS) if name in self.changed_data]
        if set(names) & set(RATE):
            names += [name for name in RATE if name not in names]
        return {name: data[name] for name in names if name in data}


class QueueAdmin(OperationsAdmin):
    form = QueueForm
    operations = (PAUSE, RESUME)
    actions = [op.as_action() for op in operations]
    list_display = ("name", "paused", *OPTIONS, "flow_control", "links")  # created at: on the queue's page
    list_filter = ("paused",)
    search_fields = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "paused", *OPTIONS, "created_at")}),
        (
            "Flow control",
            {
                "fields": FLOW_OPTIONS,
                "description": "Rate limit: at most N leases (starts) per period of seconds across all workers. "
                "Group concurrency: at most K items of one group key in flight. Fair: group keys take turns "
                "(implied by a group concurrency); weights give some keys more turns. Priority comes first. "
                "Aging rate: priority points per second a due item gains while it waits, so low priorities "
                "are not starved (not with fair leasing).",
            },
        ),
    )
    readonly_fields = ("name", "paused", "created_at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a queue is created by the first enqueue that names it

    def object_tool_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        return [("Overview", reverse("admin:queue_app_queue_overview")), *super().object_tool_links(request)]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Queue, form, change: bool) -> None:
        options = form.changed_options(form.cleaned_data)
        if options:
            services.set_queue_options(obj.name, **options)

    @admin.display(description="flow control")
    def flow_control(self, obj: Queue) -> str:
        parts = []
        if obj.rate_limit is not None:
            parts.append(f"rate {format_rate(obj.rate_limit, obj.rate_period)}")
        if obj.group_concurrency is not None:
            parts.append(f"{obj.group_concurrency} per group key")
        if obj.fair or obj.group_concurrency is not None:
            parts.append("fair")
        if obj.aging_rate is not None:
            parts.append(f"aging {obj.aging_rate:g}/s")
        return ", ".join(parts) or "-"

    @admin.display(description="rows")
    def links(self, obj: Queue) -> SafeString:
        return format_html(
            '<a href="{}">items</a> · <a href="{}">dead letters</a>',
            changelist_link("queueitem", queue__name__exact=obj.name),
            changelist_link("deadletter", item__queue__name__exact=obj.name, status="open"),
        )

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        # The overview as a page of its own (a project may also put it on the admin's home), and the fragment
        # both refresh from.
        overview = path("overview/", view(overview_page), name=self.url_name("overview"))
        fragment = path("overview/fragment/", view(overview_fragment), name=self.url_name("overview_fragment"))
        # plotly.js from the installed wheel, for every chart of the admin (charts.py).
        plotly = path("plotly.min.js", view(plotly_js), name=self.url_name("plotly_js"))
        return [overview, fragment, plotly, *super().get_urls()]
