"""Tests that start real workers carry the `slow` marker (or `spark`, for the JVM ones): a pytest plugin
(installed by tests/conftest.py) that refuses, at collection, a test using a worker-starting fixture without
either, naming each. `-m "not slow"` then leaves out every test that starts a real worker.

The fixtures that start workers are known by name. A test that starts one another way (`spawn` or `manage`
directly, or its own `subprocess`) is seen when it runs: while an unmarked test sets up and runs, every child
process started is looked at, and one running `manage.py run_worker` or `manage.py up` fails the test, naming the
command.
"""

from __future__ import annotations

import subprocess

import pytest

WORKER_FIXTURES = frozenset({"worker", "workers", "waits_worker", "spark_worker"})
MARKERS = ("slow", "spark")
PLUGIN = "jobsite_slow_guard"
WORKER_COMMANDS = frozenset({"run_worker", "up"})  # manage.py commands that start workers


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


def starts_a_worker(args) -> bool:
    """Whether a child's argv runs manage.py with a worker-starting command."""
    argv = [str(a) for a in args] if isinstance(args, list | tuple) else str(args).split()
    for n, arg in enumerate(argv):
        if arg.endswith("manage.py"):
            return argv[n + 1 : n + 2] != [] and argv[n + 1] in WORKER_COMMANDS  # the command, not its arguments
    return False


def _watch_children(item):
    """Run one phase of an unmarked test with subprocess.Popen watched; fail it if it started a worker."""
    if any(item.get_closest_marker(marker) for marker in MARKERS):
        return (yield)
    started: list[str] = []
    original = subprocess.Popen.__init__

    def watched(self, args, *rest, **kwargs):
        if starts_a_worker(args):
            started.append(" ".join(str(a) for a in args) if isinstance(args, list | tuple) else str(args))
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = watched
    try:
        result = yield
    finally:
        subprocess.Popen.__init__ = original
    if started:
        pytest.fail(f"{item.nodeid} starts a real worker and must be marked @pytest.mark.slow: {started[0]}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _watch_children(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _watch_children(item))
