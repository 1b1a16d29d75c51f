"""Polling for tests that watch real processes: wait until a condition holds, or fail saying what never came."""

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float, *, what: str, interval: float = 0.1) -> Any:
    """Return the first truthy value of `predicate()`, polling every `interval` s, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
