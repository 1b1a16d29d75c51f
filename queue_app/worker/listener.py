"""Wake-ups: LISTEN on the queue's NOTIFY channel over a dedicated connection. enqueue() notifies with the
queue's name as payload; the supervisor selects on this connection's socket and polls as a fallback.

LISTEN needs a session: behind a transaction pooler (JOBSITE["CONNECTION_POOLER"]) the connection is opened from
JOBSITE["LISTEN_DATABASE_URL"], past the pooler; without one the worker does not listen at all (a LISTEN on a
pooled server connection is dropped with it) and polls every --poll-interval (`mode` "poll"; the Worker row and
/metrics say so).

Hand-off (engine/handoff.py): with JOBSITE["HANDOFF"] on, the listening session also holds the worker's offer
lock and LISTENs on the worker's own channel; an idle worker offers a slot from it (`offer`), and an enqueue that
takes the offer notifies that channel with the leased row, which `drain` collects in `handed`.

No thundering herd: of the workers serving the same queues, the leader of the queue set's wake duty (a leader
row, engine/leaders.py) is "first" and leases as soon as a notification arrives; the others follow FOLLOW
seconds later, so one idle item is not raced for by every idle worker at once. The leader hands the duty back
when it stops listening; one that dies leaves it to expire (leaders.ttl(), a follower meanwhile answers FOLLOW
seconds late); a follower tries to take it at each poll interval.
"""

import contextlib
import logging

import psycopg
from psycopg import sql

from .. import engine
from ..conf import queue_settings
from ..engine import Lease, Terms, handoff, leaders, pooler

logger = logging.getLogger("jobsite.worker")

# How long a follower waits after a notification before it leases: long enough for the first worker's lease
# statement to take an idle item, short enough to be noise when there is more work than the first can take.
FOLLOW = 0.01
# How long a closing listener waits for the notification of an offer an enqueue took as it was withdrawn (sent at
# that enqueue's commit, which the withdrawal waited for): the lease is then released, not left to lapse.
HANDED_WAIT = 1.0


class Listener:
    def __init__(self, queues: list[str] | None, holder: str) -> None:
        self.queues = None if queues is None else set(queues)  # None: every queue
        self.holder = holder  # the worker's id: the wake duty's holder
        self.conn: psycopg.Connection | None = None
        self.first = False  # this worker leads the wake duty of our queue set
        self.mode = pooler.wakeup_mode()  # "listen", or "poll": never connects
        self.channel: str | None = None  # the worker's own channel, for hand-offs (None: HANDOFF off)
        self.lock_key = 0
        self.offer_id: int | None = None  # the slot on offer, if any
        self.handed: list[Lease] = []  # leases handed over by enqueues, drained and not taken yet

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    @property
    def listening(self) -> bool:
        """Whether this worker can listen at all (mode "listen"); `connected` says whether it does now."""
        return self.mode == "listen"

    def wake_lock_key(self) -> str:
        queues = "*" if self.queues is None else ",".join(sorted(self.queues))
        return f"{queue_settings.NOTIFY_CHANNEL}:{queues}"

    def duty(self) -> str:
        return leaders.wake_duty(self.wake_lock_key())

    def connect(self) -> None:
        self.close()
        if not self.listening:
            return
        conn = engine.listen_connection()
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queue_settings.NOTIFY_CHANNEL)))
            if queue_settings.HANDOFF:
                self.lock_key, channel = handoff.new_key()
                handoff.hold_lock(conn, self.lock_key)
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                self.channel = channel
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def offer(self, terms: Terms) -> None:
        """Offer one slot to the next plain enqueue of our queues. Raises psycopg.OperationalError when the
        connection is lost."""
        if self.connected and self.channel is not None and self.offer_id is None:
            queues = None if self.queues is None else sorted(self.queues)
            self.offer_id = handoff.offer(self.conn, self.holder, self.channel, self.lock_key, queues, terms)

    def withdraw(self) -> None:
        """Take the offer back. If an enqueue took it first (the DELETE waited for that enqueue's commit), its
        lease comes as a notification on this connection: drained with the others (`wait`: waited for here, up
        to that many seconds, when the connection is about to close). Raises psycopg.OperationalError when the
        connection is lost."""
        self._withdraw(wait=0.0)

    def _withdraw(self, wait: float) -> None:
        if self.offer_id is None or not self.connected:
            return
        taken = not handoff.withdraw(self.conn, self.offer_id)
        self.offer_id = None
        if taken and wait:
            for note in self.conn.notifies(timeout=wait):
                if note.channel == self.channel:
                    self._handed(note.payload)
                    break

    def try_first(self) -> bool:
        """Take the wake duty if no other worker of our queue set holds it. Raises psycopg.OperationalError
        when the connection is lost."""
        if self.connected and not self.first:
            self.first = leaders.take(self.duty(), self.holder, conn=self.conn)
        return self.first

    def renewed(self, duties: set[str]) -> None:
        """The duties the heartbeat found this worker still holds: the wake duty taken over by another (held
        past its expiry without a heartbeat, in an outage) makes this one a follower again."""
        if self.first and self.duty() not in duties:
            self.first = False

    def fileno(self) -> int | None:
        return self.conn.fileno() if self.connected else None

    def drain(self) -> bool:
        """Read the notifications that arrived, without waiting. True if one was for a queue we serve.
        Raises psycopg.OperationalError when the connection is lost (the caller reconnects later)."""
        if not self.connected:
            return False
        woken = False
        for note in self.conn.notifies(timeout=0):
            if note.channel == self.channel:
                self._handed(note.payload)
            elif self.queues is None or note.payload in self.queues:
                woken = True
        return woken

    def _handed(self, payload: str) -> None:
        try:
            offer_id, lease = handoff.lease_from_note(payload)
        except (KeyError, ValueError, TypeError):  # not sql.ENQUEUE_HANDOFF's (someone's NOTIFY on our channel)
            logger.warning("ignored a notification on the hand-off channel %s that carries no lease: %.200r",
                           self.channel, payload)  # fmt: skip
            return
        self.handed.append(lease)
        if offer_id == self.offer_id:
            self.offer_id = None  # taken

    def take_handed(self) -> list[Lease]:
        handed, self.handed = self.handed, []
        return handed

    def close(self, *, release: bool = True) -> None:
        """Stop listening, and hand the wake duty to a follower (`release`; not when the connection is lost:
        the duty expires instead)."""
        if self.conn is not None:
            if self.first and release:
                with contextlib.suppress(psycopg.Error):
                    leaders.release(self.holder, self.duty(), conn=self.conn)
            if release:
                with contextlib.suppress(psycopg.Error):
                    self._withdraw(wait=HANDED_WAIT)
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
            self.conn = None
        self.first = False
        self.offer_id = None  # a lost session's offer lapses with its lock
        self.channel = None
