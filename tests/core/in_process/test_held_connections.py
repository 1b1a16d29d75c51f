"""Connections the project holds outside Django's (the probes' execution-log connection, the worker's LISTEN
connection) survive the server dropping them: a terminated backend is what a PostgreSQL restart does to every
connection, here done to one, on a real server."""

import psycopg
import pytest
from django.db import connection

from queue_app import engine
from queue_app.models import ExecutionLog
from queue_app.probes.tasks import _log_connections, _log_execution, _run_record, close_log_connection
from queue_app.registry import Context, Delivery
from queue_app.worker.listener import Listener
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def terminate(pid: int) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [pid])


def record(attempt: int) -> dict:
    ctx = Context(
        item_id=1,
        reservation_id=attempt,
        attempt=attempt,
        max_attempts=3,
        task="queue_app.probe_transactional",
        queue="default",
        delivery=Delivery.TRANSACTIONAL,
        worker_id="w",
    )
    return _run_record(ctx)


def test_the_execution_log_connection_is_replaced_after_the_server_dropped_it():
    try:
        _log_execution(record(1))
        old = _log_connections.conn
        terminate(old.info.backend_pid)
        _log_execution(record(2))  # on a dropped connection: written on a new one, not an OperationalError
        assert _log_connections.conn is not old
        assert sorted(ExecutionLog.objects.values_list("attempt", flat=True)) == [1, 2]
    finally:
        close_log_connection()


def test_the_listen_connection_is_found_lost_and_reconnects():
    listener = Listener(None, "test-holder")
    listener.connect()
    try:
        terminate(listener.conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):  # one of the supervisor's DATABASE_DOWN: it reconnects
            listener.conn.execute("SELECT 1")
        listener.connect()
        engine.notify(["default"])
        wait_for(listener.drain, timeout=10, what="the notification on the new connection")
    finally:
        listener.close()
