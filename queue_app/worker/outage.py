"""The database as the supervisor's loop sees it (worker/supervisor.py): up, or down since when, and when to try
it again. Every database round is guarded; on a lost connection the loop says so once, backs off (0.5 s doubling
to 10 s) and retries, keeping finished outcomes in memory (worker/settling.py) to settle once it is back. The
LISTEN connection is retried on its own clock, never sooner than the database."""

import logging
import time
from collections.abc import Callable

from django.db import connections

from ..engine.alias import queue_db
from ..stop_signals import StopSignals
from .options import DATABASE_DOWN
from .status import fields

logger = logging.getLogger("jobsite.worker")

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0


class Outage:
    def __init__(self) -> None:
        self.since: float | None = None  # when the database went away (None: it is up)
        self.backoff = BACKOFF_FIRST
        self.retry_at = 0.0  # no database round before this
        self.listener_retry_at = 0.0  # no new LISTEN connection before this

    @property
    def down(self) -> bool:
        return self.since is not None

    def down_for(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def lost(self, exc: BaseException) -> None:
        """A database round failed for want of the server: say so once, back off, close every connection this
        thread holds (a broken one would fail the next round too); the LISTEN connection waits as long."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.backoff = BACKOFF_FIRST
            logger.warning("database unavailable; retrying with backoff %s", fields(error=repr(str(exc)[:200])))
        else:
            self.backoff = min(BACKOFF_MAX, self.backoff * 2)
        self.retry_at = now + self.backoff
        for conn in connections.all(initialized_only=True):
            try:
                conn.close()
            except Exception:  # closing a broken connection may raise; it is gone either way
                logger.debug("closing a broken connection failed", exc_info=True)
        self.listener_lost()

    def listener_lost(self) -> None:
        self.listener_retry_at = time.monotonic() + max(self.backoff, BACKOFF_FIRST)

    def back(self) -> None:
        """A database round went through: if the server was away, say for how long, and back off from scratch
        next time."""
        if self.since is not None:
            logger.warning("database back %s", fields(after=f"{time.monotonic() - self.since:.1f}s"))
            self.since = None
            self.backoff = BACKOFF_FIRST


def wait_for_database(using: str | None = None) -> bool:
    """Block until the database answers, saying so once and backing off like the loop; False when SIGTERM or
    SIGINT came first (the caller exits 0: nothing was taken). A worker started while the server restarts or is
    not up yet waits for it rather than dying; Django's own system checks connect (a GeneratedField's check asks
    the server's version), so they run after this (run_worker)."""
    outage = Outage()
    with StopSignals() as stop:  # a handler that set a threading.Event could hang the process (stop_signals.py)
        while not stop.stopped:
            try:
                connections[queue_db(using)].ensure_connection()
            except DATABASE_DOWN as exc:
                outage.lost(exc)
                stop.wait(outage.retry_at - time.monotonic())
                continue
            outage.back()
            return True
        return False


def boot_through_outages(step: Callable[[], None], using: str | None = None) -> bool:
    """Run `step` (the worker's boot: Django's system checks, which connect) once the database answers
    (wait_for_database). A connection lost between that wait and the step, or during it (the server restarted just
    then: the waits chaos run caught one), is an outage like the loop's: said, the broken connection closed (Django
    would hand the dead one to the next query), waited out, and the step run again. False when SIGTERM or SIGINT
    came first (the caller exits 0: nothing was taken)."""
    outage = Outage()
    while wait_for_database(using):
        try:
            step()
        except DATABASE_DOWN as exc:
            outage.lost(exc)
            continue
        outage.back()
        return True
    return False
