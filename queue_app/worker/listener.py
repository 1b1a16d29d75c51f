"""Wake-ups: LISTEN on the queue's NOTIFY channel over a dedicated connection. enqueue() notifies with the
queue's name as payload; the supervisor selects on this connection's socket and polls as a fallback."""

import contextlib

import psycopg
from psycopg import sql

from .. import engine
from ..conf import queue_settings


class Listener:
    def __init__(self, queues: list[str] | None) -> None:
        self.queues = None if queues is None else set(queues)  # None: every queue
        self.conn: psycopg.Connection | None = None

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def connect(self) -> None:
        self.close()
        conn = engine.dedicated_connection()
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(queue_settings.NOTIFY_CHANNEL)))
        except BaseException:
            conn.close()
            raise
        self.conn = conn

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
