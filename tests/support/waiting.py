"""Polling for tests that watch real processes: wait until a condition holds, or fail saying what never came."""

import time
from collections.abc import Callable
from typing import Any

from queue_app.models import QueueItem


def wait_for(predicate: Callable[[], Any], timeout: float, *, what: str, interval: float = 0.1) -> Any:
    """Return the first truthy value of `predicate()`, polling every `interval` s, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def drained(timeout: float) -> None:
    """Wait until no item is ready or reserved (the workers have worked through everything), or fail listing them."""
    open_items = QueueItem.objects.filter(state__in=["ready", "reserved"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not open_items.exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"items still open after {timeout:g}s: {list(open_items.values())}")


# Sessions of this database waiting for a lock: any lock, or an advisory one.
LOCK_WAITERS = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
ADVISORY_LOCK_WAITERS = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()"
)


def seen_waiting(query: str = LOCK_WAITERS, *, what: str, timeout: float = 30) -> None:
    """Wait until another session is seen blocked on a lock (`query` counts them), or fail naming `what`: how a
    test forces a race, the other side arriving while the first holds its lock."""
    from django.db import connection

    def waiters() -> int:
        with connection.cursor() as cursor:
            cursor.execute(query)
            return cursor.fetchone()[0]

    wait_for(waiters, timeout, what=what, interval=0.05)
