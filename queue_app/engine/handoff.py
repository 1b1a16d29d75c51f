"""Hand-off: the latency path of an idle queue. An idle worker offers a slot; the next plain enqueue of its queues
takes it and writes its item already reserved for that worker, in the enqueue's own statement (sql.ENQUEUE_HANDOFF),
then notifies the worker's own channel with the leased row. The worker starts the item from that notification:
no lease round trip between the enqueue's commit and the handler, which was a third of an idle start.

What may be handed off: an enqueue in a transaction of its own (not in an atomic block: a lease must not start
before its item is committed and visible), due now, without an ordering, group, dedup or debounce key, whose
payload fits in a notification, with tracing off; into a queue that is not paused, not under flow control and has
no due item waiting. Everything else is queued ready and leased as before. The lease is the one a lease statement
would have given (the worker's terms travel with its offer), fenced by its reservation like any other.

An offer is valid while the worker's listening session lives: that session holds the advisory lock
(sql.HANDOFF_LOCK_NAMESPACE, lock_key), and an enqueue takes only an offer whose lock is held. A worker killed
leaves its row untaken. A notification lost with the worker's listening connection leaves its item reserved
for a worker that never heard of it: its lease lapses and any worker leases it again, as for a worker that died.
"""

import random
import time
from datetime import datetime
from typing import Any

import psycopg

from ..conf import queue_settings
from . import sql
from .alias import queue_connection
from .lease import Lease, Terms
from .payload import decode_json, encode_json

# NOTIFY's payload is at most 8,000 bytes. A payload longer than this is queued ready and leased as before, without
# asking; the statement measures the notification itself (the payload as jsonb renders it, the names) before it
# takes an offer, so a shorter payload that renders too long is queued ready too.
PAYLOAD_MAX = 7_000

# Which statement an eligible enqueue sends. Taking an offer (sql.ENQUEUE_HANDOFF) costs about 0.15 ms more than
# ENQUEUE on an enqueue that finds none, mostly the set-up of its two writes that find nothing to write (0.46 ms
# against 0.61, back to back, a quiet 2-core machine). So a process sends it only for a queue it saw an offer
# for within OFFERS_FRESH seconds; otherwise it sends sql.ENQUEUE_PROBING, ENQUEUE with a read of the offer
# table, whose answer says whether to try next time. Each statement says whether offers were there. A worker that
# just went idle is seen by the next enqueue of its queue, and handed the one after; a busy deployment (no offer)
# pays only the read. It only picks a statement: what either does is decided in the database.
OFFERS_FRESH = 1.0
_offers_seen: dict[str, float] = {}  # queue -> when an enqueue of this process last saw an offer for it


def eligible(params: dict[str, Any], using: str | None = None) -> bool:
    """Whether this enqueue (enqueue._params's `params`, with its encoded payload) may take an offer."""
    if not queue_settings.HANDOFF or params["run_at"] is not None or params["delay"]:
        return False
    if params["ordering_key"] is not None or params["group_key"] is not None:
        return False
    payload = params["payload"]  # text: at most 4 bytes a character
    if len(payload) > PAYLOAD_MAX or (4 * len(payload) > PAYLOAD_MAX and len(payload.encode()) > PAYLOAD_MAX):
        return False
    conn = queue_connection(using)
    return not conn.in_atomic_block and conn.get_autocommit()


def statement(queue: str) -> str:
    """The statement for an eligible enqueue into `queue` (see OFFERS_FRESH)."""
    seen = _offers_seen.get(queue)
    if seen is not None and time.monotonic() - seen < OFFERS_FRESH:
        return sql.ENQUEUE_HANDOFF
    return sql.ENQUEUE_PROBING


def saw(queue: str, offers_there: bool) -> None:
    """What an enqueue's statement said of the offers for `queue`."""
    if offers_there:
        _offers_seen[queue] = time.monotonic()
    else:
        _offers_seen.pop(queue, None)


def new_key() -> tuple[int, str]:
    """A lock key and channel for one listening session: random, so a worker's new session (or a new worker on a
    recycled pid) never answers for an offer made by one gone."""
    lock_key = random.randrange(1, 2**31)
    return lock_key, f"{queue_settings.NOTIFY_CHANNEL}_h{lock_key:08x}"


def hold_lock(conn: psycopg.Connection, lock_key: int) -> None:
    """Hold the offer lock for the life of `conn`'s session (the worker's listening connection)."""
    conn.execute(sql.HOLD_OFFER_LOCK, {"namespace": sql.HANDOFF_LOCK_NAMESPACE, "lock_key": lock_key})


def offer(
    conn: psycopg.Connection,
    worker_id: str,
    channel: str,
    lock_key: int,
    queues: list[str] | None,
    terms: Terms | None,
) -> int:
    """Offer one slot on `conn` (the session holding the lock); its id."""
    params = {
        "worker_id": worker_id,
        "channel": channel,
        "lock_key": lock_key,
        "queues": None if queues is None else encode_json(sorted(queues)),
        "terms": encode_json({name: list(term) for name, term in (terms or {}).items()}),
    }
    return conn.execute(sql.OFFER, params).fetchone()[0]


def withdraw(conn: psycopg.Connection, offer_id: int) -> bool:
    """Take an offer back: True if it was still there; False if an enqueue took it (that enqueue has committed,
    and its notification is on the way)."""
    return conn.execute(sql.WITHDRAW, {"offer": offer_id}).fetchone() is not None


def lease_from_note(payload: str) -> tuple[int, Lease]:
    """The offer taken and the Lease a hand-off notification carries (sql.ENQUEUE_HANDOFF's JSON)."""
    row = decode_json(payload)
    return row["h"], Lease(
        row["r"],
        row["i"],
        row["q"],
        row["t"],
        row["p"],
        row["a"],
        row["m"],
        datetime.fromisoformat(row["e"]),
        row["o"],
        None,
        datetime.fromisoformat(row["u"]),
        datetime.fromisoformat(row["c"]),
    )
