"""lease(): take up to n items for a worker, each with a new reservation (one attempt, one fencing token);
settle_and_lease(): complete the items a worker finished and lease its next batch in one round trip."""

import functools
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from . import sql
from .alias import atomic, queue_connection
from .db import Int8Array, JsonbArray, cursor, float8_array, text_array
from .payload import decode_json, encode_json
from .settle import Held

ALL_QUEUES = ("*",)

# task name -> (its lease in seconds or None for the item's/queue's, the floor no lease may go under)
Terms = Mapping[str, tuple[float | None, float]]


class Lease(NamedTuple):
    """What a worker holds while it works on an item. `reservation_id` is the fencing token every settle names.
    A named tuple rather than a frozen dataclass: a worker makes one per item, and a frozen dataclass sets each
    of its twelve fields through object.__setattr__."""

    reservation_id: int
    item_id: int
    queue: str
    task: str
    payload: Any
    attempt: int
    max_attempts: int
    lease_expires_at: datetime
    priority: int
    ordering_key: str | None
    run_at: datetime
    created_at: datetime
    # Returned by the traced lease only (tracing on or JSON logs, `traced=True`; None otherwise): the item's
    # stored trace context (engine/tracing.py), and for a workflow step's item its workflow's id and step's name.
    trace_context: str | None = None
    workflow_id: int | None = None
    step: str | None = None

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class SettledAndLeased:
    stale: list[Held]  # completes that changed nothing: their reservation was no longer current
    leases: list[Lease]


def _lease(r: Sequence[Any]) -> Lease:
    return Lease(r[0], r[1], r[2], r[3], decode_json(r[4]), r[5], r[6], r[7], r[8], r[9], r[10], r[11])


def _lease_traced(r: Sequence[Any]) -> Lease:
    return Lease(
        r[0], r[1], r[2], r[3], decode_json(r[4]), r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14]
    )


def _terms_params(terms: Terms | None) -> dict[str, Any]:
    return _terms_arrays(tuple((terms or {}).items()))


@functools.lru_cache(maxsize=32)
def _terms_arrays(terms: tuple[tuple[str, tuple[float | None, float]], ...]) -> dict[str, Any]:
    """The terms as the lease binds them, dumped once (a worker's are the same on every lease: db.text_array)."""
    return {
        "term_tasks": text_array([name for name, _ in terms]),
        "term_leases": float8_array([lease for _, (lease, _) in terms]),
        "term_floors": float8_array([floor for _, (_, floor) in terms]),
    }


def _queue_params(queues: Sequence[str] | None) -> dict[str, Any]:
    all_queues = queues is None or tuple(queues) == ALL_QUEUES
    return {"all_queues": all_queues, "queues": [] if all_queues else list(queues)}


def _lease_named(cur: Any, queues: list[str], n: int, params: dict[str, Any], traced: bool) -> list[Lease]:
    cur.execute(sql.LEASE_TRACED if traced else sql.LEASE, {**params, "queues": queues, "n": n})
    make = _lease_traced if traced else _lease
    return [make(r) for r in cur.fetchall()]


def _lease_flow_controlled(
    cur: Any, queues: Iterable[str], n: int, params: dict[str, Any], using: str, traced: bool
) -> list[Lease]:
    """Lease from queues under flow control, each under its row lock so that concurrent workers keep its limits
    together: lock the queue row (which says the rate window's room), count what is in flight against a
    concurrency limit, lease the room left (group keys in turn when the queue leases by group; by aged priority
    when it has an aging rate), and count the leases against the rate window, all in one transaction."""
    leases: list[Lease] = []
    make = _lease_traced if traced else _lease
    for name in queues:
        if len(leases) >= n:
            break
        with atomic(using):
            cur.execute(sql.LOCK_FLOW_QUEUE, {"queue": name})
            locked = cur.fetchone()
            if locked is None:  # paused, or no flow control any more, since we looked
                continue
            concurrency_limit, rate_limit, rate_room, window, grouped, group_limit, weights, aging_rate = locked
            room = n - len(leases)
            if rate_limit is not None:
                room = min(room, rate_room)
            if concurrency_limit is not None and room > 0:
                cur.execute(sql.IN_FLIGHT, {"queue": name})
                room = min(room, concurrency_limit - cur.fetchone()[0])
            if room <= 0:
                continue
            if grouped:
                weights = decode_json(weights) or {}
                cur.execute(
                    sql.LEASE_FAIR_TRACED if traced else sql.LEASE_FAIR,
                    {
                        **params,
                        "queue": name,
                        "n": room,
                        "group_limit": group_limit,
                        "weight_keys": list(weights),
                        "weight_values": [float(w) for w in weights.values()],
                    },
                )
                got = [make(r) for r in cur.fetchall()]
            elif aging_rate is not None:
                aged = sql.LEASE_AGED_TRACED if traced else sql.LEASE_AGED
                cur.execute(aged, {**params, "queue": name, "n": room, "aging_rate": aging_rate})
                got = [make(r) for r in cur.fetchall()]
            else:
                got = _lease_named(cur, [name], room, params, traced)
            if rate_limit is not None and got:
                cur.execute(sql.SPEND_RATE, {"queue": name, "window": window, "spent": len(got)})
            leases += got
    return leases


def _own_transaction(using: str) -> bool:
    """Whether a statement run now on `using` commits by itself (autocommit, no caller's transaction open):
    then the lease may commit without waiting for the WAL flush (see sql.SETTLE_AND_LEASE)."""
    wrapper = queue_connection(using)
    return not wrapper.in_atomic_block and wrapper.get_autocommit()


def settle_and_lease(
    done: Iterable[tuple[Held, Any]],
    queues: Sequence[str] | None,
    n: int,
    worker_id: str,
    lease_timeout: float | None = None,
    *,
    terms: Terms | None = None,
    traced: bool = False,
    using: str | None = None,
) -> SettledAndLeased:
    """Complete `done` (held, result) pairs and reserve up to `n` items from `queues` (None or ALL_QUEUES:
    every queue) for `worker_id`, in one statement; queues under flow control (concurrency, rate or group
    limits, fair leasing) then take one locked transaction each. Paused queues are skipped. `terms` gives each
    task's lease (see sql._lease_ctes). Results must be JSON (InvalidEnqueue otherwise, raised before anything
    is written). `traced` (a worker with tracing on or JSON logs): the traced statements, whose leases also carry
    the items' trace contexts and workflow steps (sql._LEASED_COLUMNS_TRACED), in the same round trip."""
    pairs = list(done)
    if not pairs and n <= 0:
        return SettledAndLeased([], [])
    params = {
        "relaxed_commit": _own_transaction(using),
        "worker_id": worker_id,
        "lease_timeout": lease_timeout,
        "n": max(0, n),
        **_terms_params(terms),
        **_queue_params(queues),
        "item_ids": Int8Array([h.item_id for h, _ in pairs]),
        "reservation_ids": Int8Array([h.reservation_id for h, _ in pairs]),
        "results": JsonbArray([None if result is None else encode_json(result, "result") for _, result in pairs]),
    }
    with cursor(using) as cur:
        if pairs:
            cur.execute(sql.SETTLE_AND_LEASE_TRACED if traced else sql.SETTLE_AND_LEASE, params)
        else:  # nothing to settle: the statement without the complete's parts (sql.LEASE_OPEN)
            cur.execute(sql.LEASE_OPEN_TRACED if traced else sql.LEASE_OPEN, params)
        stale_ids: set[int] = set()
        limited: list[str] = []
        leases: list[Lease] = []
        make = _lease_traced if traced else _lease
        for row in cur.fetchall():
            if row[0] == "m":
                stale_ids, limited = set(row[1]), row[2]
            else:
                leases.append(make(row[3:]))
        if limited and len(leases) < n:
            random.shuffle(limited)  # the batch's room goes to each flow-controlled queue first in turn
            leases += _lease_flow_controlled(cur, limited, n - len(leases), params, using, traced)
    leases.sort(key=lambda lease: (-lease.priority, lease.item_id))
    return SettledAndLeased([h for h, _ in pairs if h.reservation_id in stale_ids], leases)


def lease(
    queues: Sequence[str] | None,
    n: int,
    worker_id: str,
    lease_timeout: float | None = None,
    *,
    terms: Terms | None = None,
    traced: bool = False,
    using: str | None = None,
) -> list[Lease]:
    """Reserve up to `n` items from `queues` (None or ALL_QUEUES: every queue) for `worker_id`.

    Paused queues are skipped. A queue under flow control (concurrency, rate or group limits, fair leasing) is
    leased under its row lock, so concurrent workers never exceed its limits together. The lease lasts the
    task's lease from `terms` (never under its floor), else the item's own, else `lease_timeout` seconds, else
    its queue's. `traced`: the leases carry their items' trace contexts and workflow steps (settle_and_lease).
    """
    if n <= 0:
        return []
    return settle_and_lease((), queues, n, worker_id, lease_timeout, terms=terms, traced=traced, using=using).leases


def ready_exists(queues: Sequence[str] | None, *, using: str | None = None) -> bool:
    """Whether any item of `queues` (None or ALL_QUEUES: every queue; paused ones never) is ready now, whether
    a lease could take it or it is held back (an ordering key, a rate, concurrency or group limit): what a
    `--burst` worker waits for. Delayed items and retries backing off are not ready."""
    with cursor(using) as cur:
        cur.execute(sql.READY_EXISTS, _queue_params(queues))
        return cur.fetchone()[0]
