"""List filters and search that stay on indexes: recent-time windows, task names by skip scan, exact-match
search on ids and keys (never icontains on payloads)."""

from collections.abc import Sequence
from datetime import timedelta

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from ..engine.alias import connection
from ..models import NOT_DONE_STATES_SQL, IdMark, ItemHistory, ItemState, QueueItem
from ..monitoring import SCHEDULED, SHOWN_STATES
from ..registry import registered_tasks

# -- states ---------------------------------------------------------------------------------------------------


class StateFilter(admin.SimpleListFilter):
    """The items' states in queue_stats' vocabulary (monitoring.SHOWN_STATES): "ready" is due now, "scheduled"
    ready but due later (a delay or a retry's backoff). Same parameter as a field filter, so links keep working."""

    title = "state"
    parameter_name = "state__exact"

    def lookups(self, request, model_admin):
        return [(state, state) for state in SHOWN_STATES]

    def queryset(self, request, queryset):
        value = self.value()
        if value == ItemState.READY:
            return queryset.filter(state=ItemState.READY, visible_at__lte=Now())
        if value == SCHEDULED:
            return queryset.filter(state=ItemState.READY, visible_at__gt=Now())
        return queryset.filter(state=value) if value in SHOWN_STATES else queryset


# -- time windows ---------------------------------------------------------------------------------------------

WINDOWS = {
    "1h": ("Last hour", timedelta(hours=1)),
    "24h": ("Last 24 hours", timedelta(days=1)),
    "7d": ("Last 7 days", timedelta(days=7)),
}


class RecentFilter(admin.SimpleListFilter):
    """Rows whose `field` lies within the last hour, day or week: a range scan on that column's index, or, for
    a column without one (`mark` names the IdMark column of the table's id sequence), a walk of the primary key
    from the newest id mark before the window (engine/marks.py: every row stamped since has a higher id)."""

    field = ""
    mark = ""

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in WINDOWS.items()]

    def queryset(self, request, queryset):
        window = WINDOWS.get(self.value())
        if window is None:
            return queryset
        since = timezone.now() - window[1]
        queryset = queryset.filter(**{f"{self.field}__gte": since})
        if self.mark:
            marks = IdMark.objects.filter(taken_at__lt=since).order_by("-taken_at")
            bound = marks.values_list(self.mark, flat=True).first()
            if bound is not None:
                queryset = queryset.filter(pk__gt=bound)
        return queryset


def recent(field: str, title: str, parameter: str, *, mark: str = "") -> type[RecentFilter]:
    return type(
        f"Recent{parameter.title()}Filter",
        (RecentFilter,),
        {"field": field, "title": title, "parameter_name": parameter, "mark": mark},
    )


# -- task names -----------------------------------------------------------------------------------------------

# DISTINCT task over millions of rows is a full scan; this walks item_task_not_done (task, state) one name at a
# time, and the history's itemhistory_task likewise. Those indexes hold finished items only (an index on open
# items would cost every enqueue and lease one more entry, on done items every settle: migration 0053), so the
# names of open items come from the task registry (a task that is not registered cannot be run, and its items
# soon finish as dead letters), and those of done items from the history (the archiver moves them there a
# minute after they finish; a done item ran a registered task).
DISTINCT_TASKS = f"""
WITH RECURSIVE t(task) AS (
    (SELECT task FROM {QueueItem._meta.db_table} WHERE state IN ({NOT_DONE_STATES_SQL}) ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT i.task FROM {QueueItem._meta.db_table} i
            WHERE i.state IN ({NOT_DONE_STATES_SQL}) AND i.task > t.task ORDER BY i.task LIMIT 1)
    FROM t WHERE t.task IS NOT NULL
), h(task) AS (
    (SELECT task FROM {ItemHistory._meta.db_table} ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT i.task FROM {ItemHistory._meta.db_table} i WHERE i.task > h.task ORDER BY i.task LIMIT 1)
    FROM h WHERE h.task IS NOT NULL
)
(SELECT task FROM t WHERE task IS NOT NULL LIMIT %(limit)s)
UNION
(SELECT task FROM h WHERE task IS NOT NULL LIMIT %(limit)s)
"""


def task_names(limit: int = 200) -> list[str]:
    """Registered task names and those of finished items, sorted, at most `limit`."""
    with connection.cursor() as cur:
        cur.execute(DISTINCT_TASKS, {"limit": limit})
        seen = {row[0] for row in cur.fetchall()}
    return sorted(seen | set(registered_tasks()))[:limit]


class TaskFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"
    field = "task"

    def lookups(self, request, model_admin):
        return [(name, name) for name in task_names()]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class ItemTaskFilter(TaskFilter):
    field = "item__task"


# -- exact search ---------------------------------------------------------------------------------------------

BIGINT_MAX = 2**63 - 1


def exact_search(queryset: QuerySet, term: str, *, ids: Sequence[str], keys: Sequence[str]) -> QuerySet:
    """Rows whose key columns equal the term, or (for a number, "#123" too) whose id columns do.

    Each column is its own indexed lookup and their primary keys are UNIONed (`pk IN (... UNION ALL ...)`): an
    OR across columns, or across a join, would make PostgreSQL scan the whole table.
    """
    term = term.strip()
    if not term:
        return queryset
    rows = queryset.model._default_manager
    lookups = [{key: term} for key in keys]
    number = term.removeprefix("#")
    if number.isdigit() and int(number) <= BIGINT_MAX:
        lookups += [{id_field: int(number)} for id_field in ids]
    if not lookups:
        return queryset.none()
    first, *rest = (rows.filter(**lookup).values("pk") for lookup in lookups)
    return queryset.filter(pk__in=first.union(*rest, all=True) if rest else first)
