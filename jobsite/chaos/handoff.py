"""Hand-offs in the chaos run (queue_app/engine/handoff.py): plain enqueues, one at a time while the faults fire,
into a queue that one worker of the fleet serves alone (so it goes idle between them and offers a slot) and
that every other worker serves too (so an item whose hand-off worker died is leased by another). The fault
`kill_handoff` kills that worker -9, mostly mid-run (each fed item's handler sleeps), and a new one takes its
place.

check_handoff: some fed items were handed off (reserved by their own enqueue: the reservation's reserved_at is
the item's created_at, one transaction's now()), so the path was taken under the faults; and none was handed to
a worker after it was killed (an offer of a worker gone is never taken). The general checks judge each fed item
as an at-least-once probe: run, settled once, re-run only when its worker was lost.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections
from django.db.utils import InterfaceError, OperationalError

from queue_app import engine
from queue_app.models import ItemHistory, QueueItem

from .checks import SESSION_END, Check, _examples
from .history import History, Res

TASK = "queue_app.probe"  # at-least-once
QUEUE = "chaos_handoff"
PRIORITY = 20  # ahead of the planted backlog when another worker leases a fed item
SLEEP = 0.2  # seconds each fed item's handler sleeps: a kill lands mid-run


@dataclass
class HandoffFeed:
    total: int
    using: str
    sent: list[int] = field(default_factory=list)
    failed: int = 0  # enqueues that raised (sent again)

    def tick(self) -> None:
        """Send the next item, if any is left."""
        if len(self.sent) < self.total:
            self._send()

    def finish(self) -> None:
        """Send what is left (once the faults are over); a failure here is a failure of the run."""
        while len(self.sent) < self.total:
            if not self._send():
                raise RuntimeError("a hand-off feed enqueue failed with no fault under way")

    def _send(self) -> bool:
        try:
            found = engine.enqueue(TASK, {"sleep": SLEEP}, queue=QUEUE, priority=PRIORITY, using=self.using)
        except (OperationalError, InterfaceError):
            connections[self.using].close()
            self.failed += 1
            return False
        self.sent.append(found.id)
        return True

    def ids(self) -> set[int]:
        return set(self.sent)

    def unnamed(self) -> list[int]:
        """Items of the feed's queue that no enqueue's reply named (an enqueue whose reply a restart swallowed)."""
        found: set[int] = set()
        for model in (QueueItem, ItemHistory):
            found |= set(model.objects.using(self.using).filter(queue_id=QUEUE).values_list("id", flat=True))
        return sorted(found - self.ids())


def handed(history: History, ids: set[int]) -> dict[int, Res]:
    """The items of `ids` whose first reservation their own enqueue wrote."""
    out = {}
    for item_id in sorted(ids):
        item, reservations = history.items.get(item_id), history.res_by_item.get(item_id, [])
        first = min(reservations, key=lambda r: r.id, default=None)
        if item is not None and first is not None and first.reserved_at == item.created_at:
            out[item_id] = first
    return out


def check_handoff(history: History, feed: HandoffFeed, killed: dict[str, datetime]) -> Check:
    fed = feed.ids() | set(feed.unnamed())
    taken = handed(history, fed)
    problems = []
    if not taken:
        problems.append(f"none of the {len(fed)} fed items was handed off: the path was not taken under the faults")
    late = [
        f"item {item_id} was handed to {res.worker_id} at {history.items[item_id].created_at:%H:%M:%S.%f}, after it"
        f" was killed at {killed[res.worker_id]:%H:%M:%S.%f}"
        for item_id, res in taken.items()
        if res.worker_id in killed and history.items[item_id].created_at > killed[res.worker_id] + SESSION_END
    ]
    problems += _examples(late)
    return Check(
        "hand-off: handed items under the faults, never to a worker gone",
        not problems,
        {
            "fed": len(fed),
            "handed": len(taken),
            "handed_to_killed": sum(res.worker_id in killed for res in taken.values()),
            "to_a_worker_gone": len(late),
            "failed_enqueues_resent": feed.failed,
        },
        problems,
    )
