"""Queues: their options (edited through services.set_queue_options), pause and resume (permission
pause_queue), and the URL of the overview fragment the landing page refreshes from."""

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import path
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import services
from ..models import Queue
from .actions import Operation, OperationsAdmin
from .charts import plotly_js
from .overview import changelist_link, overview_fragment

OPTIONS = ("concurrency_limit", "lease_timeout", "max_attempts", "retention")

PAUSE = Operation(
    name="pause",
    label="Pause",
    done="Paused {n} {noun}",
    permission="pause",
    eligible=lambda qs: qs.filter(paused=False),
    eligible_label="running",
    apply=lambda names, actor: sum(services.pause_queue(name) for name in names),
)
RESUME = Operation(
    name="resume",
    label="Resume",
    done="Resumed {n} {noun}",
    permission="pause",
    eligible=lambda qs: qs.filter(paused=True),
    eligible_label="paused",
    apply=lambda names, actor: sum(services.resume_queue(name) for name in names),
)


class QueueForm(forms.ModelForm):
    """A queue's options, refused per field when the queue could not run with them (services decides)."""

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        options = {name: data[name] for name in OPTIONS if name in data and name in self.changed_data}
        for name, message in services.queue_option_errors(**options).items():
            self.add_error(name, message)
        return data


class QueueAdmin(OperationsAdmin):
    form = QueueForm
    operations = (PAUSE, RESUME)
    actions = [op.as_action() for op in operations]
    list_display = ("name", "paused", *OPTIONS, "created_at", "links")
    list_filter = ("paused",)
    search_fields = ("name",)
    fields = ("name", "paused", *OPTIONS, "created_at")
    readonly_fields = ("name", "paused", "created_at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a queue is created by the first enqueue that names it

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Queue, form, change: bool) -> None:
        options = {name: form.cleaned_data[name] for name in form.changed_data if name in OPTIONS}
        if options:
            services.set_queue_options(obj.name, **options)

    @admin.display(description="rows")
    def links(self, obj: Queue) -> SafeString:
        return format_html(
            '<a href="{}">items</a> · <a href="{}">dead letters</a>',
            changelist_link("queueitem", queue__name__exact=obj.name),
            changelist_link("deadletter", item__queue__name__exact=obj.name, status="open"),
        )

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        overview = path("overview/", view(overview_fragment), name=self.url_name("overview"))
        # plotly.js from the installed wheel, for every chart of the admin (charts.py).
        plotly = path("plotly.min.js", view(plotly_js), name=self.url_name("plotly_js"))
        return [overview, plotly, *super().get_urls()]
