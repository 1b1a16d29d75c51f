"""Warm Spark runs: registered functions through jobsite's supervised Spark Connect server.

One real server for the whole module (`manage.py spark_connect_server`, local[4]: four task threads, so two
runs' tasks run side by side), real workers (`run_worker --queues spark`), and real Connect sessions. The test
that kills the server runs last: its restart costs a JVM start.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from queue_app.models import ItemState, QueueItem
from queue_app.spark import connect, warm_pool
from queue_app.spark.connect_server import Supervisor
from queue_app.spark.launcher import launch
from queue_app.spark.models import SparkConnectServer
from queue_app.spark.runs import cancel_run, trigger_run
from queue_app.spark.watch import group_members
from tests.conftest import ROOT, child_env
from tests.support import spark_workers
from tests.support.spark_workers import final, row, tasks_running, worker_env
from tests.support.waiting import wait_for

spark_worker = spark_workers.spark_worker  # the fixture

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_LOG: list = []  # the supervisor's output (its restarts, and the server's own log)


def supervisor_said(lines: int = 60) -> str:
    """The end of the supervisor's output, for a failure message (CI keeps no other trace of it)."""
    said = SERVER_LOG[0].read_text(errors="replace").splitlines() if SERVER_LOG else []
    return "\n".join(said[-lines:])


@pytest.fixture(scope="module")
def connect_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """The supervisor and its server, on a free loopback port, against the test database."""
    from tests.support.spark_fixtures import require_spark

    require_spark()
    from django.db import connection

    url = connect.parse_url(f"sc://127.0.0.1:{free_port()}")
    SERVER_LOG[:] = [tmp_path_factory.mktemp("connect") / "server.log"]
    log = SERVER_LOG[0].open("w")
    env = child_env(connection.settings_dict["NAME"], SPARK_MASTER="local[4]", JAVA_TOOL_OPTIONS="-XX:+UseSerialGC")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "spark_connect_server", "--url", str(url), "--interval", "1"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:  # stopped however the wait ends: a server that never listened is not left running for the session
        wait_for(lambda: connect.reachable(url), 300, what="the Spark Connect server to listen")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


@pytest.fixture(autouse=True)
def no_connect_marks_left():
    """pyspark marks a process that opened a Connect session (here: a test's own probe) in its environment for
    good, and a classic SparkSession made later in that process (the suite's `spark` fixture) then acts as a
    Connect client: the marks go with the test that made them."""
    yield
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE"):
        os.environ.pop(name, None)


def healthy(url) -> SparkConnectServer:
    """Wait for the supervisor's healthy row (a transactional test's flush deletes it; the next probe rewrites it)."""
    return wait_for(
        lambda: SparkConnectServer.objects.filter(url=str(url), healthy=True).first(),
        120,
        what="the server's healthy row",
    )


def test_a_run_through_the_warm_server_succeeds_with_progress_and_metrics(connect_server, spark_worker):
    server = healthy(connect_server)
    assert server.pid and server.master == "local[4]" and not server.last_error
    spark_worker(JOBSITE_SPARK_CONNECT=str(connect_server))
    run = trigger_run("demo_sleep", {"tasks": 8, "seconds": 1}, trigger="orm", requested_by="test")
    seen = []
    while not (current := row(run.id)).is_final:
        if current.progress:
            seen.append(dict(current.progress))
        time.sleep(0.1)
    run = row(run.id)
    assert run.state == "succeeded", (run.error, run.log_tail[-2000:])
    assert run.metrics == {"tasks": 8, "sum": 28}  # local[4]: two waves of tasks
    assert run.progress["path"] == "connect" and "fallback" not in run.progress
    assert run.app_id.startswith("connect-")
    assert run.progress["tasks_done"] == run.progress["tasks_total"] >= 8
    assert run.progress["jobs_done"] == run.progress["jobs_total"] == 1
    assert any(0 < p.get("tasks_done", 0) < p.get("tasks_total", 0) for p in seen), "no progress seen mid-run"
    for before, after in zip(seen, seen[1:], strict=False):  # progress never goes back, totals never shrink
        for kind in ("jobs", "stages", "tasks"):
            assert after[f"{kind}_done"] >= before[f"{kind}_done"]
            assert after[f"{kind}_total"] >= before[f"{kind}_total"]
    # The worker settles the item after the handler that finished the run returns: a moment later.
    wait_for(lambda: QueueItem.objects.get(id=run.item_id).state == ItemState.DONE, 60, what="the item settled done")
    assert group_members(run.driver_pgid) == []  # the light child is gone
    assert server.pid == healthy(connect_server).pid  # the server lives on for the next run

    # Each warm run of the worker is taken by a light child that waited for it (Django, the client and the
    # session ready): the first by the one the worker started with its pool (the Spark task's warm-up), the next
    # by the one the first run left, whatever their run ids (the child names its run itself).
    again = trigger_run("demo_sleep", {"tasks": 2, "seconds": 0}, trigger="orm", requested_by="test")
    wait_for(lambda: row(again.id).is_final, 120, what="the second warm run to end")
    again = row(again.id)
    assert again.state == "succeeded" and again.progress["path"] == "connect", again.log_tail[-2000:]
    taken = [line for r in (run, again) for line in r.log_tail.splitlines() if "the waiting light child" in line]
    assert len(taken) == 2 and taken[0] != taken[1], taken  # two runs, two different waiting children


def test_cancel_interrupts_only_that_runs_operations_while_another_run_goes_on(connect_server, spawn):
    healthy(connect_server)
    env = worker_env(JOBSITE_SPARK_CONNECT=str(connect_server))
    spawn("run_worker", "--queues", "spark", "--concurrency", "2", "--poll-interval", "0.5", env=env)
    doomed = trigger_run("demo_sleep", {"tasks": 2, "seconds": 120}, trigger="orm")
    other = trigger_run("demo_sleep", {"tasks": 2, "seconds": 6}, trigger="orm")
    for run in (doomed, other):
        try:
            tasks_running(run.id)
        except AssertionError:
            stuck = row(run.id)
            raise AssertionError((stuck.state, stuck.progress, stuck.log_tail[-3000:])) from None

    assert cancel_run(doomed.id, actor="tester") is True
    ended = wait_for(lambda: final(doomed.id), 60, what="the cancelled run to end")
    assert ended.state == "cancelled" and ended.progress["path"] == "connect"
    assert row(other.id).state == "running"  # its operations were not interrupted
    finished = wait_for(lambda: final(other.id), 120, what="the other run to end")
    assert finished.state == "succeeded", (finished.error, finished.log_tail[-2000:])
    assert finished.metrics == {"tasks": 2, "sum": 1} and finished.progress["path"] == "connect"
    assert QueueItem.objects.get(id=doomed.item_id).state == ItemState.CANCELLED
    assert group_members(ended.driver_pgid) == []


def test_an_unreachable_server_sends_runs_to_spark_submit_and_a_bad_url_fails_before_starting(spark_worker):
    nobody = f"sc://127.0.0.1:{free_port()}"
    spark_worker(JOBSITE_SPARK_CONNECT=nobody)
    run = trigger_run("demo_sleep", {"tasks": 2, "seconds": 0}, trigger="orm")
    ended = wait_for(lambda: final(run.id), 180, what="the run to end")
    assert ended.state == "succeeded", (ended.error, ended.log_tail[-2000:])
    assert ended.progress["path"] == "spark-submit" and ended.app_id.startswith("local-")
    assert f"Spark Connect server {nobody} is not healthy" in ended.log_tail

    os.environ["JOBSITE_SPARK_CONNECT"] = "sc://203.0.113.9:15002"  # not loopback: refused before anything runs
    try:
        result = launch("demo_sleep", {"tasks": 1, "seconds": 0}, 987654)
    finally:
        del os.environ["JOBSITE_SPARK_CONNECT"]
    assert result.outcome == "failed" and result.returncode is None
    assert "must be on loopback" in result.error


def test_the_next_warm_run_takes_the_spare_light_child_and_cancel_still_stops_it(connect_server, monkeypatch):
    from django.db import connection

    healthy(connect_server)
    monkeypatch.setenv("JOBSITE_SPARK_CONNECT", str(connect_server))
    env = child_env(connection.settings_dict["NAME"])
    starts: list[dict] = []
    first = launch("demo_sleep", {"tasks": 2, "seconds": 0}, "spare-1", env=env, on_start=starts.append)
    assert first.outcome == "succeeded" and first.path == "connect", first.log_tail
    assert "standby" not in starts[0]["setup_seconds"]  # this process's first warm run starts its own child
    spare = warm_pool._spare["proc"]
    assert spare.poll() is None  # started for the next run, waiting on its stdin

    running: list[dict] = []
    try:
        second = launch(
            "demo_sleep",
            {"tasks": 2, "seconds": 120},
            "spare-2",
            env=env,
            on_start=starts.append,
            on_progress=lambda p: running.append(p) if p.get("tasks_active") else None,
            should_cancel=lambda: bool(running),
        )
        assert starts[1]["pid"] == spare.pid and "standby" in starts[1]["setup_seconds"]
        assert second.outcome == "cancelled" and second.path == "connect", second.log_tail
        assert group_members(spare.pid) == []  # the spare was the run's child; its group is gone with it
        next_spare = warm_pool._spare["proc"]
        assert next_spare.pid != spare.pid and next_spare.poll() is None  # the next one is ready
    finally:
        warm_pool.drop_spare()
    assert next_spare.poll() is not None and group_members(next_spare.pid) == []  # dropped: nothing left of it


def test_a_restart_that_finds_the_port_taken_is_recorded_and_tried_again_not_given_up():
    """The server died and, before its restart, another process took its port: the supervisor says so on the
    server's row and tries again each round; it neither exits (no server would ever come back) nor counts a
    restart per attempt."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        url = connect.parse_url(f"sc://127.0.0.1:{taken.getsockname()[1]}")
        said: list[str] = []
        supervisor = Supervisor(url, master="local[1]", interval=0.1, log=said.append)
        supervisor.proc = subprocess.Popen(["true"])  # a server that has exited
        supervisor.proc.wait()
        supervisor.step()
        assert supervisor.proc is None and supervisor.restarts == 1
        server = SparkConnectServer.objects.get(url=str(url))
        assert not server.healthy and server.restarts == 1 and server.pid is None
        assert "cannot restart the server" in server.last_error and "in use already" in server.last_error
        supervisor.step()
        assert supervisor.proc is None and supervisor.restarts == 1 and supervisor.backoff == 4.0
        assert [line for line in said if "trying again" in line] == [
            f"spark connect server: cannot restart the server: 127.0.0.1:{url.port} is in use already: pick another"
            f" port; trying again in {wait:.0f}s"
            for wait in (2, 4)
        ]
        supervisor.stop()


@pytest.mark.parametrize(
    "value, message",
    [
        ("http://127.0.0.1:15002", "expected sc://"),
        ("sc://10.0.0.5:15002", "must be on loopback"),
        ("sc://127.0.0.1:99999", "bad port"),
        ("sc://user@127.0.0.1:15002", "expected sc://"),
        ("sc://127.0.0.1:15002/;token=x", "expected sc://"),
    ],
)
def test_hostile_connect_urls_are_refused_with_a_clear_message(value, message):
    with pytest.raises(connect.ConnectConfigError, match=message):
        connect.parse_url(value)


def test_server_killed_mid_run_the_run_falls_back_to_spark_submit_and_the_server_restarts(connect_server, spark_worker):
    server = healthy(connect_server)
    spark_worker(JOBSITE_SPARK_CONNECT=str(connect_server))
    run = trigger_run("demo_sleep", {"tasks": 2, "seconds": 8}, trigger="orm")
    running = tasks_running(run.id)
    assert running.progress.get("path") == "connect"
    error, probing = connect.probe(connect_server)  # a session like the supervisor's, kept across the kill
    assert error == ""

    os.killpg(os.getpgid(server.pid), signal.SIGKILL)  # the server's JVM, not its supervisor
    # A probe caught mid-query by the server's death fails in seconds, so the supervisor sees the exit and
    # restarts the server (with the client's default ten minutes of retries, it did not: the test's old flake).
    failed = []
    query = threading.Thread(target=lambda: failed.append(connect.probe_error(probing)), daemon=True)
    query.start()
    query.join(60)
    assert not query.is_alive(), "a probe of a dead server should give up, not retry for minutes"
    assert failed[0]
    ended = wait_for(lambda: final(run.id), 240, what="the run to end")
    assert ended.state == "succeeded", (ended.error, ended.log_tail[-3000:])
    assert ended.progress["path"] == "spark-submit" and ended.progress["fallback"]
    assert "falls back to spark-submit" in ended.log_tail
    assert ended.metrics == {"tasks": 2, "sum": 1} and ended.attempt == 1
    try:
        restarted = wait_for(
            lambda: SparkConnectServer.objects.filter(url=str(connect_server), healthy=True, restarts__gte=1).first(),
            240,
            what="the supervisor to restart the server",
        )
    except AssertionError as exc:
        row = SparkConnectServer.objects.filter(url=str(connect_server)).values().first()
        raise AssertionError(f"{exc}\nits row: {row}\nthe supervisor said:\n{supervisor_said()}") from None
    assert restarted.pid != server.pid


def test_spark_connect_server_refuses_a_non_loopback_url_and_starts_nothing():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="must be on loopback"):
        call_command("spark_connect_server", "--url", "sc://0.0.0.0:15002")
    with pytest.raises(CommandError, match="--interval must be positive"):
        call_command("spark_connect_server", "--url", "sc://127.0.0.1:15002", "--interval", "0")
    # No row for either (the module's own server, on another port, writes its row whenever it probes).
    assert not SparkConnectServer.objects.filter(id__endswith=":15002").exists()
