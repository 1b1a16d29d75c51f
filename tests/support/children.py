"""The end of a test's child processes (the `spawn` fixture's teardown, tests/conftest.py).

A child's death does not end its server sessions at once: a backend still running the statement the child sent
goes on until it next reads the socket. One that holds a table's lock while it waits for another's deadlocked the
test database's reset, whose table locks come next (seen in CI, after a workflow test killed a worker mid-step).
So each child's sessions carry one `application_name` (libpq reads PGAPPNAME from the child's environment), and
`end` kills every child's process group, then ends those sessions with `pg_terminate_backend(pid, timeout)`,
which returns once each has gone: the reset starts with none of them left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid

import psycopg


def new_tag() -> str:
    """The `application_name` the sessions of one test's children share."""
    return f"jobsite-test-child-{uuid.uuid4().hex[:12]}"


def sessions(connection, tag: str) -> list[int]:
    """The server processes of the sessions named `tag`."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [tag])
        return [pid for (pid,) in cursor.fetchall()]


def end(children: list[subprocess.Popen], tag: str, connection) -> None:
    """Kill each child still running, with its process group (a process pool's children too), then end the
    sessions named `tag`, waiting up to 10 s for each to go. On a connection of its own, opened with the Django
    connection's parameters: a browser test's teardown runs where Playwright's event loop makes Django's
    connection refuse to be used (SynchronousOnlyOperation)."""
    for proc in children:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if children:
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as own:
            own.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE application_name = %s", [tag]
            )
