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
