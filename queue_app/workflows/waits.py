"""Events for workflows that wait (issue 39): `send_event` stores an event and ends the event wait open for its
name and key, in one statement of the caller's transaction (rolled back with it); `send_events` sends a batch in
one statement. Waits are steps (`wf.wait_event`, workflows/definition.py); their SQL, and the claim of a kept
event when a wait opens, are in workflows/sql.py. Events no wait claimed are dropped when their lookback ends
(`drop_expired_events`, the worker's drop_events maintenance unit)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..conf import queue_settings
from ..engine.alias import atomic, queue_connection
from ..engine.db import cursor
from ..engine.errors import InvalidEnqueue
from ..engine.payload import encode_json
from ..receiver import claim_once
from . import sql
from .definition import STEP_NAME, WorkflowError

# An event's own id (send_event's `id=`) is claimed as this text in ReceivedWebhook, the inbound endpoint's replay
# guard: one table, one unique key, for both (the endpoint's ids are "<source>:<webhook-id>").
ID_CLAIM = "events:{id}"
MAX_ID = 192  # the claim's column holds 200 characters


@dataclass(frozen=True)
class SentEvent:
    id: int | None  # the stored event's id; None for a duplicate (nothing stored)
    name: str
    key: str
    step_id: int | None  # the event wait it ended now, or None: kept for the lookback (or a duplicate)
    workflow_id: int | None
    sent_id: str | None = None  # the sender's id, when it gave one
    duplicate: bool = False  # an event with that id was sent before: this one stored and ended nothing

    @property
    def matched(self) -> bool:
        return self.step_id is not None


def send_event(
    name: str, key: str, payload: Any = None, *, id: str | None = None, using: str | None = None
) -> SentEvent:
    """Send the event `name` with `key`: the oldest step waiting for it ends now with `payload` (any JSON value)
    as its result; with none waiting it is kept for JOBSITE WORKFLOW_EVENT_LOOKBACK seconds and ends the first
    wait for it created meanwhile. Each event ends at most one wait, each wait takes one event. Runs in the
    caller's transaction. `id`: the sender's id of this event (1-192 characters): an event whose id was sent
    before is a duplicate (a retry): it stores and ends nothing and comes back with `duplicate` True. The id is
    claimed (a unique key) in the transaction that stores the event, so of two concurrent sends of one id the
    second waits for the first to commit and is then the duplicate. WorkflowError for a bad name, key or id
    (1-200 characters, no control characters) or a payload that is not JSON, before anything is written.
    `using`: the database alias."""
    encoded = _checked(name, key, payload)
    if id is not None and (not isinstance(id, str) or not STEP_NAME.match(id) or len(id) > MAX_ID):
        raise WorkflowError(f"bad event id {id!r}: 1-{MAX_ID} characters, no control characters")
    params = {
        "name": name,
        "key": key,
        "payload": encoded,
        "lookback": float(queue_settings.WORKFLOW_EVENT_LOOKBACK),
    }
    with atomic(using):
        if id is not None and not claim_once(ID_CLAIM.format(id=id), using=using):
            return SentEvent(None, name, key, None, None, sent_id=id, duplicate=True)
        with cursor(using) as cur:
            cur.execute(sql.WORKFLOW_EVENT_LOCK, params)
            cur.execute(sql.WORKFLOW_SEND_EVENT, params)
            event_id, step_id, workflow_id, _ = cur.fetchone()
    return SentEvent(event_id, name, key, step_id, workflow_id, sent_id=id)


def _checked(name: Any, key: Any, payload: Any) -> str:
    for what, value in (("event name", name), ("event key", key)):
        if not isinstance(value, str) or not STEP_NAME.match(value):
            raise WorkflowError(f"bad {what} {value!r}: 1-200 characters, no control characters")
    try:
        return encode_json(payload, "payload")
    except InvalidEnqueue as exc:
        raise WorkflowError(f"event {name!r}: {exc}") from None


def send_events(events: Iterable[tuple[str, str, Any]], *, using: str | None = None) -> list[SentEvent]:
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
    with atomic(using), queue_connection(using).cursor() as cur:
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
    with atomic(), cursor() as cur:
        cur.execute(sql.WORKFLOW_DROP_EXPIRED_EVENTS, {"limit": limit})
        return cur.fetchone()[0]
