"""A test's children are ended, their server sessions with them, before the test database is reset
(tests/support/children.py): a killed child's backend that still holds a lock would otherwise meet the reset's
table locks (a deadlock in CI once)."""

import os
import signal

import psycopg
import pytest
from django.db import connection

from tests.support import children
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOLD = (
    "from django.db import connection, transaction\n"
    "with transaction.atomic(), connection.cursor() as c:\n"
    "    c.execute('LOCK TABLE queue_app_queue IN ROW EXCLUSIVE MODE')\n"
    "    c.execute('SELECT pg_sleep(120)')\n"
)


def _reset_lock_taken() -> bool:
    """Whether the reset's SHARE lock on the table is free now (NOWAIT: no waiting on the child's backend)."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=False) as other:
        try:
            other.execute("LOCK TABLE queue_app_queue IN SHARE MODE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return False
        return True


def test_a_killed_childs_session_holding_a_lock_is_ended_before_the_reset(spawn):
    proc = spawn("shell", "-c", HOLD)
    wait_for(
        lambda: any("pg_sleep" in q for q in _queries(spawn.tag)),
        60,
        what="the child asleep in its statement, holding its lock",
    )
    os.killpg(proc.pid, signal.SIGKILL)  # the child is gone ...
    proc.wait(10)
    assert children.sessions(connection, spawn.tag) and not _reset_lock_taken()  # ... its backend and lock are not

    children.end([proc], spawn.tag, connection)

    assert children.sessions(connection, spawn.tag) == []
    assert _reset_lock_taken()


def _queries(tag: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE application_name = %s AND state = 'active'", [tag])
        return [q for (q,) in cursor.fetchall()]
