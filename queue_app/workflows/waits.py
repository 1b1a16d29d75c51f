"""Events for workflows that wait (issue 39): `send_event` stores an event and ends the event wait open for its
name and key, in one statement of the caller's transaction (rolled back with it); `send_events` sends a batch in
one statement. Waits are steps (`wf.wait_event`, workflows/definition.py); their SQL, and the claim of a kept
event when a wait opens, are in workflows/sql.py. Events no wait claimed are dropped when their lookback ends
(`drop_expired_events`, the worker's drop_events maintenance unit)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from ..conf import queue_settings
from ..engine.db import cursor
from ..engine.errors import InvalidEnqueue
from ..engine.payload import encode_json
from . import sql
from .definition import STEP_NAME, WorkflowError


@dataclass(frozen=True)
class SentEvent:
    id: int
    name: str
    key: str
    step_id: int | None  # the event wait it ended now, or None: kept for the lookback
    workflow_id: int | None

    @property
    def matched(self) -> bool:
        return self.step_id is not None


def send_event(name: str, key: str, payload: Any = None, *, using: str = "default") -> SentEvent:
    """Send the event `name` with `key`: the oldest step waiting for it ends now with `payload` as its result;
    with none waiting it is kept for JOBSITE WORKFLOW_EVENT_LOOKBACK seconds and ends the first wait for it
    created meanwhile. Each event ends at most one wait, each wait takes one event. Runs in the caller's
    transaction. WorkflowError for a bad name or key (1-200 characters, no control characters) or a payload that
    is not JSON, before anything is written. `using`: the database alias."""
    encoded = _checked(name, key, payload)
    params = {
        "name": name,
        "key": key,
        "payload": encoded,
        "lookback": float(queue_settings.WORKFLOW_EVENT_LOOKBACK),
    }
    with transaction.atomic(using=using), cursor(using) as cur:
        cur.execute(sql.WORKFLOW_EVENT_LOCK, params)
        cur.execute(sql.WORKFLOW_SEND_EVENT, params)
        event_id, step_id, workflow_id, _ = cur.fetchone()
    return SentEvent(event_id, name, key, step_id, workflow_id)


def _checked(name: Any, key: Any, payload: Any) -> str:
    for what, value in (("event name", name), ("event key", key)):
        if not isinstance(value, str) or not STEP_NAME.match(value):
            raise WorkflowError(f"bad {what} {value!r}: 1-200 characters, no control characters")
    try:
        return encode_json(payload, "payload")
    except InvalidEnqueue as exc:
        raise WorkflowError(f"event {name!r}: {exc}") from None


def send_events(events: Iterable[tuple[str, str, Any]], *, using: str = "default") -> list[SentEvent]:
    """Send many events at once, each `(name, key, payload)`: one multi-row statement stores them all and matches
    them as `send_event` would one after another in the order given (per name and key, the oldest waiting steps
    end first, one event each; the rest are kept for the lookback), in one transaction, the caller's if any.
    Returns a SentEvent per event, in order. Every event is checked first: one bad name, key or payload raises
    WorkflowError and nothing is written."""
    rows = [(name, key, _checked(name, key, payload)) for name, key, payload in events]
    if not rows:
        return []
    names, keys, payloads = (list(column) for column in zip(*rows, strict=True))
    params = {
        "names": names,
        "keys": keys,
        "payloads": payloads,
        "lookback": float(queue_settings.WORKFLOW_EVENT_LOOKBACK),
    }
    # Planned per call, not prepared: a generic plan of the batch statement ignores the batch's size and ran ten
    # times slower (0.5 s for 1,000 events against 50 ms).
    with transaction.atomic(using=using), connections[using].cursor() as cur:
        cur.execute(sql.WORKFLOW_EVENTS_LOCK, params)
        cur.execute(sql.WORKFLOW_SEND_EVENTS, params)
        ids, steps, workflows, _ = cur.fetchone()
    return [
        SentEvent(i, name, key, step, wf)
        for i, name, key, step, wf in zip(ids, names, keys, steps, workflows, strict=True)
    ]


def drop_expired_events(limit: int) -> int:
    """Delete up to `limit` events that no wait claimed and whose lookback has ended; how many were deleted.
    Claimed events are kept (their step's record)."""
    with transaction.atomic(), cursor() as cur:
        cur.execute(sql.WORKFLOW_DROP_EXPIRED_EVENTS, {"limit": limit})
        return cur.fetchone()[0]
