"""The webhooks' admin pages: endpoints (added and changed through
queue_app.webhooks.services; the secret shown once
at creation and at each rotation, never again), send a test event, enable or disable; deliveries with every
attempt, replay one, or every failed one since a time after a confirmation page."""

import json
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from ...admin.actions import BOTH_LOCATIONS, Operation, OperationsAdmin, ReadOnlyAdmin
from ...admin.display import cut, preformatted, pretty_json, shorten, time_column
from ...models import ItemState, QueueItem
from .. import services as webhooks
from ..events import EVENT_TYPES, WEBHOOK_QUEUE
from ..models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

FIELDS = ("url", "event_types", "description", "enabled", "ordered", "rate_limit", "item_event_queues")
PERMISSIONS = {
    "send_test": "jobsite_webhooks.send_test_webhookendpoint",
    "rotate": "jobsite_webhooks.rotate_secret_webhookendpoint",
    "replay": "jobsite_webhooks.replay_webhookdelivery",
    "endpoint_change": "jobsite_webhooks.change_webhookendpoint",
}


class EndpointForm(forms.ModelForm):
    """Endpoint fields, each refused with the service's own message (webhooks.endpoint_errors)."""

    url = forms.CharField(max_length=2000, widget=forms.URLInput(attrs={"size": 80}), help_text="http(s) only.")
    event_types = forms.MultipleChoiceField(
        choices=[(name, f"{name} — {text}") for name, text in EVENT_TYPES.items()],
        widget=forms.CheckboxSelectMultiple,
    )
    item_event_queues = forms.CharField(
        required=False,
        help_text="Comma-separated queue names whose items raise item.done / item.failed for this endpoint.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["item_event_queues"] = ", ".join(self.instance.item_event_queues)

    def clean_item_event_queues(self) -> list[str]:
        return [q.strip() for q in self.cleaned_data["item_event_queues"].split(",") if q.strip()]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        fields = {name: data.get(name) for name in ("url", "event_types", "description", "rate_limit")}
        fields["item_event_queues"] = data.get("item_event_queues") or []
        for name, message in webhooks.endpoint_errors(**fields).items():
            if name not in self.errors:
                self.add_error(name, message)
        return data


SEND_TEST = Operation(
    name="send_test",
    label="Send a test event to",
    done="Queued a test event to {n} {noun}",
    permission="send_test",
    eligible=lambda qs: qs.filter(enabled=True),
    eligible_label="enabled",
    apply=lambda pks, actor: len(webhooks.send_test_event(pks, {"message": "jobsite test event", "by": actor})),
)
ENABLE = Operation(
    name="enable",
    label="Enable",
    done="Enabled {n} {noun}",
    permission="endpoint_change",
    eligible=lambda qs: qs.filter(enabled=False),
    eligible_label="disabled",
    apply=lambda pks, actor: webhooks.set_enabled(pks, True),
)
DISABLE = Operation(
    name="disable",
    label="Disable",
    done="Disabled {n} {noun}",
    permission="endpoint_change",
    eligible=lambda qs: qs.filter(enabled=True),
    eligible_label="enabled",
    apply=lambda pks, actor: webhooks.set_enabled(pks, False),
)


class WebhookPermissions:
    def has_send_test_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["send_test"])

    def has_rotate_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["rotate"])

    def has_replay_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["replay"])

    def has_endpoint_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PERMISSIONS["endpoint_change"])


@admin.action(permissions=["rotate"], description="Rotate the secret (old and new both sign for 24 hours)")
def rotate_secret(modeladmin: "WebhookEndpointAdmin", request: HttpRequest, queryset: QuerySet) -> None:
    for endpoint in queryset.order_by("id"):
        secret = webhooks.rotate_secret(endpoint.id)
        LogEntry.objects.log_actions(
            user_id=request.user.pk,
            queryset=WebhookEndpoint.objects.filter(pk=endpoint.pk),
            action_flag=CHANGE,
            change_message="Rotated the secret (admin action rotate_secret)",
        )
        modeladmin.message_user(
            request,
            f"Endpoint {endpoint.id}: new secret {secret} — copy it now, it is not shown again. The old secret "
            f"also signs until {webhooks.ROTATION_WINDOW} from now.",
            messages.WARNING,
        )


rotate_secret.location = BOTH_LOCATIONS


class WebhookEndpointAdmin(WebhookPermissions, OperationsAdmin):
    form = EndpointForm
    operations = (SEND_TEST, ENABLE, DISABLE)
    actions = [*(op.as_action() for op in operations), rotate_secret]
    list_display = ("id", "url_short", "events", "enabled", "ordered", "rate_limit", "health", "links")
    list_filter = ("enabled", "ordered")
    search_fields = ("=id", "url")
    readonly_fields = ("secret_note", "previous_secret_until", "failing_since", "disabled_reason", "created_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return FIELDS if obj is None else (*FIELDS, *self.readonly_fields)

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: EndpointForm, change: bool) -> None:
        data = {name: form.cleaned_data[name] for name in FIELDS}
        if change:
            webhooks.update_endpoint(obj.pk, **{name: data[name] for name in form.changed_data if name in FIELDS})
            obj.refresh_from_db()
            return
        created = webhooks.create_endpoint(
            data.pop("url"), data.pop("event_types"), enabled=data.pop("enabled"), **data
        )
        obj.pk = created.endpoint.pk
        obj.refresh_from_db()
        self.message_user(
            request,
            f"Secret of endpoint {obj.pk}: {created.secret} — copy it now, it is not shown again "
            "(rotate it to get a new one).",
            messages.WARNING,
        )

    def get_deleted_objects(self, objs, request: HttpRequest):
        # An endpoint's deliveries and attempts go with it (listed on the confirmation page); they are never
        # deleted on their own, so their admin grants no delete permission that Django would otherwise demand.
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        webhooks.delete_endpoints([obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        webhooks.delete_endpoints(list(queryset.values_list("pk", flat=True)))

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        endpoint = WebhookEndpoint.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        if request.method == "GET" and endpoint is not None and not endpoint.enabled and endpoint.disabled_reason:
            self.message_user(request, f"This endpoint is disabled: {endpoint.disabled_reason}", messages.ERROR)
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="secret")
    def secret_note(self, obj: WebhookEndpoint) -> str:
        return "Shown once when the endpoint was created or its secret rotated; never again."

    @admin.display(description="url", ordering="url")
    def url_short(self, obj: WebhookEndpoint) -> SafeString | str:
        return cut(obj.url, "wide")  # whole on hover

    @admin.display(description="event types")
    def events(self, obj: WebhookEndpoint) -> str:
        return shorten(", ".join(obj.event_types), 60)

    @admin.display(description="health")
    def health(self, obj: WebhookEndpoint) -> str:
        if not obj.enabled:
            return "disabled" + (" (automatically)" if obj.disabled_reason else "")
        return f"failing since {obj.failing_since:%Y-%m-%d %H:%M}" if obj.failing_since else "ok"

    @admin.display(description="rows")
    def links(self, obj: WebhookEndpoint) -> SafeString:
        url = reverse("admin:jobsite_webhooks_webhookdelivery_changelist")
        return format_html('<a href="{}?endpoint__id__exact={}">deliveries</a>', url, obj.pk)


# -- deliveries -------------------------------------------------------------------------------------------------


# The items of failed deliveries: dead ones of the webhooks queue (item_history serves it).
def _dead_items() -> QuerySet:
    return QueueItem.objects.filter(state=ItemState.DEAD, queue_id=WEBHOOK_QUEUE).values("id")


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("failed", "Failed (dead letter)"), ("pending", "Pending or sending"), ("delivered", "Delivered")]

    def queryset(self, request, queryset):
        if self.value() == "failed":
            return queryset.filter(item_id__in=_dead_items())
        if self.value() == "pending":
            open_items = QueueItem.objects.filter(queue_id=WEBHOOK_QUEUE, state__in=["ready", "reserved"])
            return queryset.filter(item_id__in=open_items.values("id"))
        if self.value() == "delivered":
            return queryset.filter(delivered_at__isnull=False)
        return queryset


class SinceFilter(admin.SimpleListFilter):
    """Created at or after a time: the choices, or any ISO time in ?since=."""

    title = "created since"
    parameter_name = "since"

    def lookups(self, request, model_admin):
        choices = [("1h", "Last hour"), ("24h", "Last 24 hours"), ("7d", "Last 7 days")]
        value = self.value()
        if value and value not in dict(choices):
            choices.append((value, value))
        return choices

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        presets = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
        since = timezone.now() - presets[value] if value in presets else parse_datetime(value)
        if since is None:
            raise IncorrectLookupParameters(f"since={value!r} is not a time (use e.g. 2026-01-31T12:00)")
        if timezone.is_naive(since):
            since = timezone.make_aware(since, timezone.get_current_timezone())
        return queryset.filter(created_at__gte=since)


REPLAY = Operation(
    name="replay",
    label="Replay",
    done="Replayed {n} {noun}",
    permission="replay",
    eligible=lambda qs: qs.filter(endpoint__enabled=True).exclude(
        item_id__in=QueueItem.objects.filter(queue_id=WEBHOOK_QUEUE, state__in=["ready", "reserved"]).values("id")
    ),
    eligible_label="finished (failed, delivered or skipped) and of an enabled endpoint",
    apply=lambda pks, actor: webhooks.replay_deliveries(pks, actor=actor),
    bulk_button=True,
)


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ("attempt", "started_at", "status_code", "latency_ms", "error", "response")
    readonly_fields = fields
    ordering = ("id",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="response (truncated)")
    def response(self, obj: WebhookAttempt) -> SafeString | str:
        return preformatted(obj.response_body)


class ReplaySinceForm(forms.Form):
    since = forms.DateTimeField(help_text="Failed deliveries created at or after this time (server time zone).")
    endpoint = forms.ModelChoiceField(WebhookEndpoint.objects.order_by("id"), required=False)


class WebhookDeliveryAdmin(WebhookPermissions, ReadOnlyAdmin):
    operations = (REPLAY,)
    actions = [op.as_action() for op in operations]
    inlines = [AttemptInline]
    # State, attempts, status and the last attempt's error first: they stay on screen at 1,440 px; the error,
    # the endpoint's URL and the webhook id are cut, whole on hover (and the error whole on the delivery's page).
    list_display = (
        "id",
        "state",
        "attempts",
        "status",
        "last_error_short",
        "endpoint_short",
        "event_type",
        "webhook_id_short",
        "created",
    )
    list_select_related = ("endpoint",)
    list_filter = ("endpoint", "event_type", StateFilter, SinceFilter)
    search_fields = ("=webhook_id", "=id")
    search_help_text = "Exact webhook-id (msg_...) or delivery id."
    fields = (
        "id",
        "endpoint",
        "event_type",
        "webhook_id",
        "state",
        "item",
        "attempt_count",
        "last_status_code",
        "last_error_shown",
        "created_at",
        "delivered_at",
        "payload",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The last attempt's error (an HTTP status, a timeout, the SSRF guard's refusal), stored on its attempt
        # row in the statement that counts the attempt: one probe of webhookattempt_delivery per row.
        last = WebhookAttempt.objects.filter(delivery=OuterRef("pk")).order_by("-id").values("error")[:1]
        return super().get_queryset(request).defer("body").annotate(last_error=Subquery(last))

    @admin.display(description="last error")
    def last_error_short(self, obj: WebhookDelivery) -> SafeString | str:
        return cut(getattr(obj, "last_error", None), "narrow")

    @admin.display(description="last attempt's error")
    def last_error_shown(self, obj: WebhookDelivery) -> SafeString | str:
        return preformatted(getattr(obj, "last_error", None) or "") if getattr(obj, "last_error", None) else "-"

    def get_changelist_instance(self, request: HttpRequest):
        changelist = super().get_changelist_instance(request)
        self._states = webhooks.delivery_states(changelist.result_list)
        return changelist

    created = time_column("created_at", "created at", ordering="created_at")

    @admin.display(description="attempts", ordering="attempt_count")
    def attempts(self, obj: WebhookDelivery) -> int:
        return obj.attempt_count

    @admin.display(description="status", ordering="last_status_code")
    def status(self, obj: WebhookDelivery) -> int | str:
        return obj.last_status_code or "-"

    @admin.display(description="endpoint", ordering="endpoint")
    def endpoint_short(self, obj: WebhookDelivery) -> SafeString | str:
        return cut(str(obj.endpoint), "narrow")

    @admin.display(description="webhook id", ordering="webhook_id")
    def webhook_id_short(self, obj: WebhookDelivery) -> SafeString | str:
        return cut(obj.webhook_id, "narrow")

    @admin.display(description="state")
    def state(self, obj: WebhookDelivery) -> str:
        states = getattr(self, "_states", {})
        return states.get(obj.id) or webhooks.delivery_states([obj])[obj.id]

    @admin.display(description="queue item")
    def item(self, obj: WebhookDelivery) -> SafeString | str:
        if obj.item_id is None:
            return "-"
        return format_html(
            '<a href="{}">#{}</a>', reverse("admin:queue_app_queueitem_change", args=[obj.item_id]), obj.item_id
        )

    @admin.display(description="body")
    def payload(self, obj: WebhookDelivery) -> SafeString:
        return pretty_json(json.loads(obj.body))

    # -- replay failed since ----------------------------------------------------------------------------------

    def get_urls(self) -> list:
        since = path(
            "replay-since/", self.admin_site.admin_view(self.replay_since_view), name=self.url_name("replay_since")
        )
        return [since, *super().get_urls()]

    def object_tool_links(self, request: HttpRequest) -> list[tuple[str, str]]:
        links = super().object_tool_links(request)
        if self.has_replay_permission(request):
            links.append(("Replay failed since…", reverse(f"{self.admin_site.name}:{self.url_name('replay_since')}")))
        return links

    def replay_since_view(self, request: HttpRequest) -> HttpResponse:
        """Pick a time (and an endpoint): on to the confirmation page of "Replay all matching" for the failed
        deliveries created since then, which says how many before anything is sent."""
        if not (self.has_view_permission(request) and self.has_replay_permission(request)):
            raise PermissionDenied
        form = ReplaySinceForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            query = {"state": "failed", "since": form.cleaned_data["since"].isoformat()}
            if form.cleaned_data["endpoint"] is not None:
                query["endpoint__id__exact"] = form.cleaned_data["endpoint"].pk
            return HttpResponseRedirect(self.bulk_url(REPLAY, urlencode(query)))
        context = {
            **self.admin_site.each_context(request),
            "title": "Replay failed deliveries since…",
            "opts": self.opts,
            "form": form,
            "changelist_url": self.changelist_url(),
        }
        return TemplateResponse(request, "admin/jobsite_webhooks/webhooks/replay_since.html", context)


admin.site.register(WebhookEndpoint, WebhookEndpointAdmin)
admin.site.register(WebhookDelivery, WebhookDeliveryAdmin)
