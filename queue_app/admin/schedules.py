"""Cron schedules: configuration, so editable (unlike the queue's rows). The form checks the cron string, the time
zone and the target (a registered task, django.tasks functions included, or a Spark job with valid params)
before anything is saved; the detail page shows the cron in words and its next five fire times, and the last
fires. Enable, disable and "run now" are Operations behind the change_schedule permission (scheduling.py does
the work: enabling recomputes the next fire time, "run now" records a manual fire)."""

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import scheduling
from ..conf import queue_settings
from ..engine.errors import InvalidEnqueue
from ..engine.payload import encode_json
from ..models import Schedule, ScheduleFire, TargetKind
from ..registries import shown_names
from ..registry import find_task, registered_tasks
from ..scheduling import UnknownTargetKind, target_of
from .actions import Operation, OperationsAdmin
from .display import preformatted, shorten

UPCOMING = 5  # fire times shown on the detail page
RECENT_FIRES = 20  # fires listed on the detail page

ENABLE = Operation(
    name="enable",
    label="Enable",
    done="Enabled {n} {noun}",
    permission="change",
    eligible=lambda qs: qs.filter(enabled=False),
    eligible_label="disabled",
    apply=lambda pks, actor: scheduling.set_enabled(pks, True),
)
DISABLE = Operation(
    name="disable",
    label="Disable",
    done="Disabled {n} {noun}",
    permission="change",
    eligible=lambda qs: qs.filter(enabled=True),
    eligible_label="enabled",
    apply=lambda pks, actor: scheduling.set_enabled(pks, False),
)


def _run_now(pks: list[int], actor: str) -> int:
    return sum(scheduling.run_now(schedule) is not None for schedule in Schedule.objects.filter(pk__in=pks))


RUN_NOW = Operation(
    name="run_now",
    label="Run now",
    done="Fired {n} {noun} now",
    permission="run_now",
    eligible=lambda qs: qs,
    eligible_label="fired",
    apply=_run_now,
)


def _django_task_payload_problem(payload: Any) -> str | None:
    """A django.tasks function is called as func(*args, **kwargs) from {"args": [...], "kwargs": {...}}."""
    if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
        return 'a django.tasks task takes {"args": [...], "kwargs": {...}} (both optional) as its payload'
    if not isinstance(payload.get("args", []), list) or not isinstance(payload.get("kwargs", {}), dict):
        return 'a django.tasks task takes {"args": [...], "kwargs": {...}}: args a list, kwargs an object'
    return None


class PayloadField(forms.JSONField):
    """JSON the queue can store, by the engine's own rules (no NaN or Infinity, bounded depth and size, valid
    UTF-8, no NUL): a schedule never holds a payload every fire of it would fail to enqueue, and text nested too
    deeply for Python's JSON parser is an error on the field, not a server error."""

    def to_python(self, value: Any) -> Any:
        try:
            value = super().to_python(value)
        except RecursionError:
            raise ValidationError(
                f"payload nested deeper than {queue_settings.MAX_PAYLOAD_DEPTH} levels", code="invalid"
            ) from None
        if value is not None:
            try:
                encode_json(value)
            except InvalidEnqueue as exc:
                raise ValidationError(str(exc), code="invalid") from None
        return value

    def prepare_value(self, value: Any) -> Any:
        text = super().prepare_value(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate typed as "\udcff": re-shown escaped, a page must be UTF-8
            return json.dumps(value, cls=self.encoder)
        return text

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:  # re-shown as the text typed, like any other invalid JSON
            return InvalidJSONInput(data)


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ("name", "enabled", "cron", "timezone", "catch_up", "target_kind", "target", "payload", "dedup_window")
        field_classes = {"payload": PayloadField}
        help_texts = {
            "cron": "Five fields: minute hour day-of-month month day-of-week, read by croniter "
            "(e.g. '*/10 * * * *', '0 3 * * 1-5').",
            "timezone": "IANA time zone the cron is read in, e.g. 'UTC' or 'Europe/Paris'.",
            "target": "A registered task name (see run_worker's task list), a django.tasks function's module "
            "path, or a Spark job name.",
            "payload": 'The task\'s payload (django.tasks: {"args": [...], "kwargs": {...}}), or the Spark '
            "job's params.",
        }

    def clean_cron(self) -> str:
        return scheduling.validate_cron(self.cleaned_data["cron"])

    def clean_timezone(self) -> str:
        return scheduling.validate_timezone(self.cleaned_data["timezone"].strip())

    def clean_dedup_window(self) -> float | None:
        window = self.cleaned_data["dedup_window"]
        if window is not None and window < 0:  # 0 or empty: no dedup (scheduling.py reads it as "off")
            raise ValidationError("a number of seconds >= 0, or empty for no dedup window", code="invalid")
        return window

    def clean_target(self) -> str:
        return self.cleaned_data["target"].strip()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        kind, target, payload = data.get("target_kind"), data.get("target"), data.get("payload")
        if not target or "payload" in self.errors:
            return data
        if kind == TargetKind.TASK:
            self._clean_task_target(target, payload)
            return data
        try:  # a layer's kind: the app that runs it says what is wrong (hooks.schedule_targets)
            problems = target_of(kind).problems(target, payload)
        except UnknownTargetKind as exc:
            problems = [("target_kind", str(exc), "unknown_kind")]
        for field, message, code in problems:
            self.add_error(field, ValidationError(message, code=code))
        return data

    def _clean_task_target(self, target: str, payload: Any) -> None:
        from ..tasks_backend import run_django_task

        task = find_task(target)
        if task is None:
            self.add_error(
                "target",
                ValidationError(
                    f"No task named {target!r} is registered. "
                    f"Registered tasks: {shown_names(list(registered_tasks()))}. "
                    "A django.tasks function is named by its module path (e.g. 'billing.tasks.send_invoice').",
                    code="unknown_task",
                ),
            )
        elif task.func is run_django_task and (problem := _django_task_payload_problem(payload)):
            self.add_error("payload", ValidationError(problem, code="invalid_payload"))


class RecentFiresFormSet(BaseInlineFormSet):
    def get_queryset(self) -> QuerySet:
        if not hasattr(self, "_recent"):
            self._recent = super().get_queryset().order_by("-fire_at")[:RECENT_FIRES]
        return self._recent


class ScheduleFireInline(admin.TabularInline):
    """The schedule's last fires, newest first: read-only."""

    model = ScheduleFire
    formset = RecentFiresFormSet
    verbose_name_plural = f"last {RECENT_FIRES} fires"
    fields = ("fire_at", "manual", "item", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="item")
    def item(self, obj: ScheduleFire) -> SafeString | str:
        if obj.item_id is None:
            return "- (dedup window held by an earlier item)"
        url = reverse("admin:queue_app_queueitem_change", args=[obj.item_id])
        return format_html('<a href="{}">#{}</a>', url, obj.item_id)


@admin.register(Schedule)
class ScheduleAdmin(OperationsAdmin):
    form = ScheduleForm
    operations = (ENABLE, DISABLE, RUN_NOW)
    actions = [op.as_action() for op in operations]
    inlines = (ScheduleFireInline,)
    list_display = (
        "name",
        "cron",
        "cron_in_words",
        "timezone",
        "target_display",
        "enabled",
        "last_fire_at",
        "next_fire_at",
        "last_error_short",
    )
    list_display_links = ("name",)
    list_filter = ("enabled", "target_kind", "catch_up")
    search_fields = ("name", "target")
    search_help_text = "Part of the schedule's name or target."
    fieldsets = (
        (None, {"fields": ("name", "enabled")}),
        ("When", {"fields": ("cron", "timezone", "upcoming", "catch_up", "dedup_window")}),
        ("What", {"fields": ("target_kind", "target", "payload")}),
        ("State", {"fields": ("last_fire_at", "next_fire_at", "last_error_pre", "created_at")}),
    )
    readonly_fields = ("upcoming", "last_fire_at", "next_fire_at", "last_error_pre", "created_at")

    def has_run_now_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Firing a schedule's target is a change to the schedule's life: the same permission as editing it.
        return self.has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Schedule, form: ScheduleForm, change: bool) -> None:
        timing = {"cron", "timezone", "enabled"}
        if not change or timing & set(form.changed_data) or (obj.enabled and obj.next_fire_at is None):
            scheduling.reschedule(obj)
        if form.changed_data:
            obj.last_error = ""  # the operator changed the configuration; the next fire says if it works
        super().save_model(request, obj, form, change)

    # -- columns ----------------------------------------------------------------------------------------------

    @admin.display(description="in words")
    def cron_in_words(self, obj: Schedule) -> str:
        return scheduling.describe(obj.cron)

    @admin.display(description="target", ordering="target")
    def target_display(self, obj: Schedule) -> str:
        payload = json.dumps(obj.payload, ensure_ascii=False) if obj.payload else ""
        return shorten(f"{obj.get_target_kind_display()}: {obj.target} {payload}".strip())

    @admin.display(description="last error")
    def last_error_short(self, obj: Schedule) -> str:
        return shorten(obj.last_error) or "-"

    @admin.display(description="last error")
    def last_error_pre(self, obj: Schedule) -> SafeString | str:
        return preformatted(obj.last_error)

    @admin.display(description="next fire times")
    def upcoming(self, obj: Schedule | None) -> SafeString | str:
        if obj is None or obj.pk is None:
            return "Shown once the schedule is saved."
        try:
            times = scheduling.fire_times(obj.cron, obj.timezone, timezone.now(), UPCOMING)
        except Exception as exc:  # a row edited behind the form's back: say so rather than fail the page
            return f"cannot compute fire times: {exc}"
        zone = ZoneInfo(obj.timezone)
        note = "" if obj.enabled else " (disabled: these fire only once it is enabled)"
        return format_html(
            "<p><strong>{}</strong>{}</p><ol class='schedule-upcoming'>{}</ol>",
            scheduling.describe(obj.cron),
            note,
            format_html_join("", "<li>{}</li>", ((_fire_time(t, zone),) for t in times)),
        )


def _fire_time(moment: datetime, zone: ZoneInfo) -> str:
    local = moment.astimezone(zone)
    text = local.strftime("%a %Y-%m-%d %H:%M %Z")
    return text if local.utcoffset() == moment.utcoffset() else f"{text} ({moment:%H:%M} UTC)"
