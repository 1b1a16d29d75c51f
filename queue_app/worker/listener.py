"""Wake-ups: LISTEN on the queue's NOTIFY channel over a dedicated connection. enqueue() notifies with the
queue's name as payload; the supervisor selects on this connection's socket and polls as a fallback.

No thundering herd: of the workers serving the same queues, the one whose LISTEN connection holds the wake lock
(a session advisory lock, engine.try_wake_lock) is "first" and leases as soon as a notification arrives; the
others follow FOLLOW seconds later, so one idle item is not raced for by every idle worker at once. The lock goes
with the connection: when the first worker stops or loses its connection, a follower takes it at its next try.
"""

import contextlib

import psycopg
from psycopg import sql

from .. import engine
from ..conf import queue_settings

# How long a follower waits after a notification before it leases: long enough for the first worker's lease
# statement to take an idle item, short enough to be noise when there is more work than the first can take.
FOLLOW = 0.01


class Listener:
    def __init__(self, queues: list[str] | None) -> None:
        self.queues = None if queues is None else set(queues)  # None: every queue
        self.conn: psycopg.Connection | None = None
        self.first = False  # this connection holds the wake lock of our queue set

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def wake_lock_key(self) -> str:
        queues = "*" if self.queues is None else ",".join(sorted(self.queues))
        return f"{queue_settings.NOTIFY_CHANNEL}:{queues}"

    def connect(self) -> None:
        self.close()
        conn = engine.dedicated_connection()
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queue_settings.NOTIFY_CHANNEL)))
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def try_first(self) -> bool:
        """Take the wake lock if no other worker of our queue set holds it. Raises psycopg.OperationalError
        when the connection is lost."""
        if self.connected and not self.first:
            self.first = engine.try_wake_lock(self.conn, self.wake_lock_key())
        return self.first

    def fileno(self) -> int | None:
        return self.conn.fileno() if self.connected else None

    def drain(self) -> bool:
        """Read the notifications that arrived, without waiting. True if one was for a queue we serve.
        Raises psycopg.OperationalError when the connection is lost (the caller reconnects later)."""
        if not self.connected:
            return False
        woken = False
        for note in self.conn.notifies(timeout=0):
            if self.queues is None or note.payload in self.queues:
                woken = True
        return woken

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
            self.conn = None
        self.first = False
