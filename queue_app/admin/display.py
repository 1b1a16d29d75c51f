"""How queue rows read in the admin: lists get text cut short (payloads, errors, tracebacks), detail pages get
it whole and JSON pretty-printed. Everything goes through format_html, so a payload's markup is shown, not run."""

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils.dateformat import format as format_date
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timezone import localtime

LIST_TEXT_CHARS = 80  # payloads, errors and tracebacks are cut to this in lists; shown whole on detail
HEAD_CHARS = 200  # what the database sends for a list cell (LEFT(...)), so a 1 MB payload never travels


def shorten(text: str | None, chars: int = LIST_TEXT_CHARS) -> str:
    return Truncator(" ".join((text or "").split())).chars(chars)


# To the second: a retry's backoff, a lease and a heartbeat are seconds apart (Django's default hides them).
SECONDS_FORMAT = "Y-m-d H:i:s T"


def to_the_second(value: datetime | None) -> str:
    return "-" if value is None else format_date(localtime(value), SECONDS_FORMAT)


def cut(text: str | None, width: str = "") -> SafeString | str:
    """A list cell's long value on one line, cut by CSS at its column's width (change_list.html: `width` "" or
    "narrow" or "wide"), the whole of it in its title, shown on hover."""
    text = " ".join((text or "").split())
    if not text:
        return "-"
    return format_html('<span class="cut{}" title="{}">{}</span>', f" cut-{width}" if width else "", text, text)


def task_in_queue(task: str, queue: str) -> SafeString:
    """The task over its queue in one list column (two narrow lines where two columns took a laptop's width)."""
    return format_html('{}<br><span class="cut cut-quiet" title="queue {}">{}</span>', cut(task), queue, queue)


def list_time(value: datetime | None) -> SafeString | str:
    """A list cell's time: month, day and time to the second; the year and zone in its title."""
    if value is None:
        return "-"
    local = localtime(value)
    return format_html(
        '<time title="{}">{}</time>', format_date(local, SECONDS_FORMAT), format_date(local, "m-d H:i:s")
    )


def time_column(field: str, description: str, ordering: str | None = None) -> Callable[[Any, Any], Any]:
    """A list column of the time `field` (list_time)."""

    @admin.display(description=description, ordering=ordering)
    def shown(self: Any, obj: Any) -> SafeString | str:
        return list_time(getattr(obj, field))

    return shown


def seconds_field(field: str, description: str) -> Callable[[Any, Any], str]:
    """A detail page's read-only field showing the time `field` to the second (name it `<field>_s`)."""

    @admin.display(description=description)
    def shown(self: Any, obj: Any) -> str:
        return to_the_second(getattr(obj, field))

    return shown


def pretty_json(value: Any) -> SafeString:
    return format_html('<pre class="queue-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False))


def preformatted(text: str) -> SafeString | str:
    return format_html('<pre class="queue-text">{}</pre>', text) if text else "-"


class ItemColumns:
    """Columns of rows that belong to an item (dead letters, reservations): the item as a link, its queue and
    task (their lists select the item along), and the row's own error, cut short."""

    @admin.display(description="task (queue)")
    def task_queue(self, obj: Any) -> SafeString:
        return task_in_queue(obj.item.task, obj.item.queue_id)

    @admin.display(description="item", ordering="item_id")
    def item_link(self, obj: Any) -> SafeString:
        url = reverse("admin:queue_app_queueitem_change", args=[obj.item_id])
        return format_html('<a href="{}">#{}</a>', url, obj.item_id)

    @admin.display(description="queue")
    def queue(self, obj: Any) -> str:
        return obj.item.queue_id

    @admin.display(description="task")
    def task(self, obj: Any) -> str:
        return obj.item.task

    @admin.display(description="error")
    def error_short(self, obj: Any) -> SafeString | str:
        return cut(shorten(obj.error_head, HEAD_CHARS), "narrow")


class AttemptColumns:
    """An attempt's list columns, hot or archived (reservations.ReservationAdmin, history.ReservationHistoryAdmin):
    its worker cut short and its times to the second."""

    @admin.display(description="worker", ordering="worker_id")
    def worker(self, obj: Any) -> SafeString | str:
        return cut(obj.worker_id, "narrow")

    reserved = time_column("reserved_at", "reserved at")
    lease_until = time_column("lease_expires_at", "lease until")
    finished = time_column("finished_at", "finished at")
