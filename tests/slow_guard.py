"""Tests that start real workers carry the `slow` marker (or `spark`, for the JVM ones): a pytest plugin
(installed by tests/conftest.py) that refuses, at collection, a test using a worker-starting fixture without
either, naming each. `-m "not slow"` then leaves out every test that starts a real worker.

The fixtures that start workers are known by name; a test that starts one through `spawn` or `manage` directly
is marked by its author (the fixture cannot tell a worker from another command).
"""

from __future__ import annotations

import pytest

WORKER_FIXTURES = frozenset({"worker", "workers", "waits_worker", "spark_worker"})
MARKERS = ("slow", "spark")
PLUGIN = "jobsite_slow_guard"


def unmarked(items) -> list[str]:
    """The node ids of the items that use a worker-starting fixture and carry none of MARKERS."""
    return [
        item.nodeid
        for item in items
        if WORKER_FIXTURES & set(getattr(item, "fixturenames", ()))
        and not any(item.get_closest_marker(marker) for marker in MARKERS)
    ]


def pytest_collection_modifyitems(session, config, items) -> None:
    if found := unmarked(items):
        names = "\n  ".join(found)
        raise pytest.UsageError(
            f"tests that start real workers must be marked @pytest.mark.slow (or spark):\n  {names}"
        )
