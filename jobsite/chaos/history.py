"""Everything a chaos run left in the database, read once into plain tuples for the checks.

Read with `using` (the run's private cluster, or a test database), ordered by id so the checks are
deterministic. Nothing here judges; checks.py does.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from queue_app.models import (
    DeadLetter,
    ExecutionLog,
    IdMark,
    ItemHistory,
    ProbeEffect,
    QueueItem,
    Reservation,
    ReservationHistory,
)


@dataclass(frozen=True, slots=True)
class Item:
    id: int
    task: str
    state: str
    ordering_key: str | None
    visible_at: datetime
    reservation_id: int | None
    queue: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Res:
    id: int
    item_id: int
    attempt: int
    worker_id: str
    reserved_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str


@dataclass(frozen=True, slots=True)
class Run:
    """One ExecutionLog row: one run of a probe's handler."""

    id: int
    item_id: int
    reservation_id: int
    attempt: int
    worker_id: str
    pid: int
    executed_at: datetime


@dataclass
class History:
    items: dict[int, Item]
    reservations: dict[int, Res]
    res_by_item: dict[int, list[Res]] = field(default_factory=lambda: defaultdict(list))
    runs_by_item: dict[int, list[Run]] = field(default_factory=lambda: defaultdict(list))
    runs: list[Run] = field(default_factory=list)
    effects: dict[str, int] = field(default_factory=dict)  # ProbeEffect key (item id) -> applied
    dead_letters: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))  # open ones' reasons
    now: datetime | None = None
    archived: int = 0  # items found in the partitioned history (moved there by the workers' archiver)
    in_both: list[int] = field(default_factory=list)  # items found hot and archived at once: a broken move
    marks: list[tuple[datetime, int, int]] = field(default_factory=list)  # IdMark (taken_at, item, reservation)

    def close_time(self, item_id: int) -> datetime | None:
        """When the item's last attempt ended (None while an attempt is open or it never ran)."""
        res = self.res_by_item.get(item_id, [])
        if not res or any(r.finished_at is None for r in res):
            return None
        return max(r.finished_at for r in res)


def load(using: str, *, exclude_queues: tuple[str, ...] = ()) -> History:
    """The rows of a run; items of `exclude_queues` (and their attempts and dead letters) left out."""
    from django.db import connections

    # Hot rows and those the archiver moved into the history (engine/history.py): a row in both, or in
    # neither, would be a move that lost or doubled it, which the checks then report.
    items: dict[int, Item] = {}
    archived, in_both = 0, []
    for model in (QueueItem, ItemHistory):
        for row in (
            model.objects.using(using)
            .exclude(queue_id__in=exclude_queues)
            .order_by("id")
            .values_list(
                "id", "task", "state", "ordering_key", "visible_at", "reservation_id", "queue_id", "created_at"
            )
            .iterator(chunk_size=20_000)
        ):
            if row[0] in items:
                in_both.append(row[0])
            archived += model is ItemHistory
            items[row[0]] = Item(*row)
    reservations: dict[int, Res] = {}
    for model in (Reservation, ReservationHistory):
        for row in (
            model.objects.using(using)
            .order_by("id")
            .values_list("id", "item_id", "attempt", "worker_id", "reserved_at", "finished_at", "outcome", "error")
            .iterator(chunk_size=20_000)
        ):
            if row[1] in items:
                reservations[row[0]] = Res(*row)
    history = History(items, reservations, archived=archived, in_both=in_both)
    for res in reservations.values():
        history.res_by_item[res.item_id].append(res)
    for row in (
        ExecutionLog.objects.using(using)
        .order_by("id")
        .values_list("id", "item_id", "reservation_id", "attempt", "worker_id", "pid", "executed_at")
        .iterator(chunk_size=20_000)
    ):
        run = Run(*row)
        history.runs.append(run)
        history.runs_by_item[run.item_id].append(run)
    history.effects = dict(ProbeEffect.objects.using(using).values_list("key", "applied"))
    for item_id, reason in (
        DeadLetter.objects.using(using)
        .filter(requeued_at__isnull=True)
        .exclude(item__queue_id__in=exclude_queues)
        .values_list("item_id", "reason")
    ):
        history.dead_letters[item_id].append(reason)
    history.marks = list(
        IdMark.objects.using(using).order_by("taken_at").values_list("taken_at", "item_id", "reservation_id")
    )
    with connections[using].cursor() as cur:
        cur.execute("SELECT now()")
        history.now = cur.fetchone()[0]
    return history


def first_leases(db: str, item_ids) -> dict[int, datetime]:
    """{item id: its first reservation's reserved_at}, across the hot and history tables."""
    from django.db.models import Min

    first_lease: dict[int, datetime] = {}
    for model in (Reservation, ReservationHistory):
        for item_id, first in (
            model.objects.using(db).filter(item_id__in=[i for i in item_ids if i is not None]).values("item_id")
            .annotate(first=Min("reserved_at")).values_list("item_id", "first")
        ):  # fmt: skip
            first_lease[item_id] = min(first, first_lease.get(item_id, first))
    return first_lease
