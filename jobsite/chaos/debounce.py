"""Debounced enqueues and chunked handlers in the chaos run.

DebounceFeed: while the faults fire, the harness keeps enqueuing at-least-once probes under a few debounce keys
(`{"debounce": key, "seq": n}`, n rising per key, ahead of the backlog by priority), each enqueue recorded with the
id it returned, so workers lease a key's item while later enqueues of the key start the next one. An enqueue
that fails (the database restarting under the harness's own connection) is sent again with the same payload, and
counted: such an enqueue may have committed with its reply lost, so an item of a key whose id no reply named is
one of those.

check_debounce: per key, the items (hot and archived) in id order ran payloads of rising seq, the last item
carries the last payload sent (the key's latest payload ran, never lost), every enqueue's id names an item whose
final payload is that enqueue's or a later one of its key (absorbed, never dropped), the absorbed counts add up
to the enqueues, and no sample taken during the run found two ready, never-leased items of one key.

check_chunks: the chunked probes' items were run in handler calls of more than one item (their runs share an
`executed_at`: probes/tasks.py), and every one of them is among the items the other checks judged.
"""

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db import connections
from django.db.utils import InterfaceError, OperationalError

from queue_app import engine
from queue_app.models import ItemHistory, QueueItem

from .checks import Check, _examples
from .history import History
from .plan import QUEUE

TASK = "queue_app.probe"  # at-least-once
DEBOUNCE, DEBOUNCE_MAX = 0.3, 1.0  # seconds: quiet window, longest wait
# Ahead of the planted backlog, so a key's item is leased once due while its key is still being fed (behind it,
# every enqueue of a key would collapse into one item that waits for the backlog).
PRIORITY = 10  # leased first: the lease orders by priority DESC


@dataclass
class DebounceFeed:
    keys: int
    per_key: int  # enqueues per key
    using: str
    rng: random.Random
    sent: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))  # key -> (seq, id)
    failed: int = 0  # enqueues that raised (sent again)
    samples: int = 0
    double_ready: list[str] = field(default_factory=list)

    def key_names(self) -> list[str]:
        return [f"debounce-{k}" for k in range(self.keys)]

    def tick(self, share: float = 0.5) -> None:
        """Send the next enqueue of about `share` of the keys not yet done; sample the one-ready-item rule."""
        for key in self.key_names():
            if len(self.sent[key]) < self.per_key and self.rng.random() < share:
                self._send(key)
        try:
            with connections[self.using].cursor() as cur:
                cur.execute(
                    "SELECT debounce_key FROM queue_app_queueitem WHERE queue_id = %s AND debounce_key = ANY(%s)"
                    " AND state = 'ready' AND reservation_id IS NULL GROUP BY 1 HAVING count(*) > 1",
                    [QUEUE, self.key_names()],
                )
                self.double_ready += [row[0] for row in cur.fetchall()]
            self.samples += 1
        except (OperationalError, InterfaceError):
            connections[self.using].close()

    def finish(self) -> None:
        """Send what is left (once the faults are over); a failure here is a failure of the run."""
        for key in self.key_names():
            while len(self.sent[key]) < self.per_key:
                if not self._send(key):
                    raise RuntimeError(f"debounced enqueue of {key} failed with no fault under way")

    def _send(self, key: str) -> bool:
        seq = len(self.sent[key])
        try:
            found = engine.enqueue(
                TASK, {"debounce": key, "seq": seq}, queue=QUEUE, priority=PRIORITY, debounce_key=key,
                debounce=DEBOUNCE, debounce_max=DEBOUNCE_MAX, using=self.using,
            )  # fmt: skip
        except (OperationalError, InterfaceError):
            connections[self.using].close()
            self.failed += 1
            return False
        self.sent[key].append((seq, found.id))
        return True

    def ids(self) -> set[int]:
        return {item_id for pairs in self.sent.values() for _, item_id in pairs}

    def unnamed(self) -> list[int]:
        """Items of the feed's keys that no enqueue's reply named (an enqueue whose reply a restart swallowed)."""
        rows = self._rows()
        return sorted(set(rows) - self.ids())

    def _rows(self) -> dict[int, tuple[str, int, int, str]]:
        """id -> (key, seq of its final payload, absorbed, state), hot and archived."""
        rows = {}
        for model in (QueueItem, ItemHistory):
            query = model.objects.using(self.using).filter(queue_id=QUEUE, debounce_key__in=self.key_names())
            for item_id, key, payload, absorbed, state in query.values_list(
                "id", "debounce_key", "payload", "absorbed", "state"
            ):
                rows[item_id] = (key, int(payload["seq"]), absorbed, state)
        return rows


def check_debounce(feed: DebounceFeed) -> Check:
    rows = feed._rows()
    problems, items_per_key = [], {}
    by_key: dict[str, list[int]] = defaultdict(list)
    for item_id, (key, *_rest) in sorted(rows.items()):
        by_key[key].append(item_id)
    for key in feed.key_names():
        sent, ids = feed.sent[key], by_key.get(key, [])
        items_per_key[key] = len(ids)
        if not sent:
            problems.append(f"{key}: nothing was sent")
            continue
        seqs = [rows[i][1] for i in ids]
        if seqs != sorted(seqs):
            problems.append(f"{key}: the items' payloads, in id order, are seq {seqs}: not rising")
        if not ids or ids[-1] != sent[-1][1] or seqs[-1] != sent[-1][0]:
            problems.append(f"{key}: the last payload sent (seq {sent[-1][0]}, item {sent[-1][1]}) is not the last run")
        for seq, item_id in sent:
            if item_id not in rows:
                problems.append(f"{key}: enqueue seq {seq} returned item {item_id}, which is gone")
            elif rows[item_id][1] < seq:
                problems.append(f"{key}: item {item_id} ran seq {rows[item_id][1]}, older than enqueue seq {seq}")
        counted = sum(1 + rows[i][2] for i in ids)
        if not len(sent) <= counted <= len(sent) + feed.failed:
            problems.append(f"{key}: {len(sent)} enqueues (+{feed.failed} failed) but the items count {counted}")
        problems += [f"{key}: item {i} ended {rows[i][3]}" for i in ids if rows[i][3] != "done"]
    problems += [f"{key}: two ready items never leased in one sample" for key in sorted(set(feed.double_ready))]
    unnamed = sorted(set(rows) - feed.ids())
    if len(unnamed) > feed.failed:
        problems.append(f"items {unnamed} were named by no enqueue's reply, and only {feed.failed} enqueues failed")
    enqueues = sum(len(s) for s in feed.sent.values())
    figures = {
        "keys": feed.keys,
        "enqueues": enqueues,
        "failed_enqueues_resent": feed.failed,
        "items": len(rows),
        "unnamed_items": len(unnamed),
        "absorbed": sum(r[2] for r in rows.values()),
        "items_per_key": items_per_key,
        "samples": feed.samples,
        "double_ready": len(feed.double_ready),
    }
    return Check("debounce: each key's latest payload ran", not problems, figures, _examples(problems))


def check_chunks(h: History, chunked: list[int]) -> Check:
    """The chunked probes ran in calls of several items (else the run proved nothing about chunks); whether each
    ended as its mode promises is check_lost's, duplicates check_duplicates'."""
    ids = set(chunked)
    calls = Counter((r.worker_id, r.pid, r.executed_at) for r in h.runs if r.item_id in ids)
    states = Counter(h.items[i].state for i in ids if i in h.items)
    problems = [] if not ids or max(calls.values(), default=0) > 1 else ["no handler call took more than one item"]
    figures = {
        "items": len(ids),
        "runs": sum(calls.values()),
        "handler_calls": len(calls),
        "largest_chunk": max(calls.values(), default=0),
        "states": dict(states),
    }
    return Check("chunked handlers ran chunks", not problems, figures, problems)
