"""A pool thread or child that waited for its job checks its database connection by a look at the socket, not by
the round trip of Django's CONN_HEALTH_CHECKS at the job's first query (worker/pool.py): a healthy connection
skips the round trip; one the server closed meanwhile is still found out, and replaced before the handler's
query."""

import psycopg
import pytest
from django.db import connection

from queue_app.worker.execute import Job, Outcome
from queue_app.worker.pool import ThreadPool, _checked_by_socket
from tests.support.pool_runner import wait_outcomes
from tests.support.waiting import wait_for


def _backend_pid() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def _terminate(pid: int) -> None:
    """End backend `pid` from a connection of its own, and wait until the server has closed it."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        wait_for(
            lambda: not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone(),
            10,
            what=f"backend {pid} to exit",
            interval=0.01,
        )


@pytest.mark.django_db(transaction=True)
def test_a_healthy_idle_connection_skips_the_round_trip_and_a_closed_one_is_left_to_djangos_check():
    first = _backend_pid()
    connection.close_if_unusable_or_obsolete()  # as after every job: the next first query would check
    assert connection.health_check_done is False
    _checked_by_socket()
    assert connection.health_check_done is True  # nothing to read on the socket: no SELECT 1 ahead of the job

    connection.close_if_unusable_or_obsolete()
    _terminate(first)
    _checked_by_socket()
    assert connection.health_check_done is False  # the server's goodbye is on the socket: Django checks
    assert _backend_pid() != first  # ... finds it unusable, and reconnects before the query


def _pid_job(job: Job) -> Outcome:
    pid = _backend_pid()
    connection.close_if_unusable_or_obsolete()  # as run_job does after each job
    return Outcome(job.reservation_id, "ok", {"pid": pid})


@pytest.mark.django_db(transaction=True)
def test_a_pool_thread_whose_connection_the_server_ended_while_idle_runs_its_next_job_on_a_new_one():
    pool = ThreadPool(1, _pid_job)
    pool.start()
    try:
        pool.submit(Job(1, 1, "q", "t", {}, 1, 1, "test"))
        (one,) = wait_outcomes(pool, 1)
        _terminate(one.result["pid"])
        pool.submit(Job(2, 2, "q", "t", {}, 1, 1, "test"))
        (two,) = wait_outcomes(pool, 1)
    finally:
        pool.shutdown()
    assert two.status == "ok", two.error
    assert two.result["pid"] != one.result["pid"]
