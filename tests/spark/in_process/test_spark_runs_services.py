"""The Spark run services without a JVM: one trigger function that validates before it queues anything, cancel
of a run not started yet, re-run, the handler's refusal to start a cancelled run, orphan groups of an earlier
attempt, the CLI, and the Java system check."""

import getpass
import json
import socket
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from queue_app import services
from queue_app.models import ItemState, QueueItem
from queue_app.registry import Context, Delivery, get_task
from queue_app.spark import SparkParamError, UnknownSparkJob
from queue_app.spark.checks import java_runtime
from queue_app.spark.models import SparkRun
from queue_app.spark.runs import (
    HARD_TIMEOUT,
    MAX_RUN_TIMEOUT,
    TASK,
    cancel_run,
    kill_orphan,
    rerun,
    timing_split,
    trigger_run,
    triggered,
)
from queue_app.spark.watch import group_members

pytestmark = pytest.mark.django_db


def nothing_queued() -> bool:
    return not SparkRun.objects.exists() and not QueueItem.objects.exists()


def test_trigger_creates_the_run_and_its_item_on_the_spark_queue():
    run = trigger_run("demo_sleep", {"tasks": "3"}, trigger="orm", requested_by="me", timeout=60)
    item = QueueItem.objects.get(id=run.item_id)
    assert (item.queue_id, item.task, item.payload, item.state) == ("spark", TASK, {"run_id": run.id}, "ready")
    assert run.params == {"tasks": 3, "seconds": 1.0, "fail": False}  # typed, defaults filled in
    assert (run.state, run.trigger, run.requested_by, run.timeout) == ("queued", "orm", "me", 60.0)


def test_bad_parameters_are_rejected_with_every_field_and_nothing_is_queued():
    with pytest.raises(SparkParamError) as caught:
        trigger_run("demo_sleep", {"tasks": 0, "seconds": "soon", "colour": "red"}, trigger="orm")
    assert set(caught.value.errors) == {"tasks", "seconds", "colour"}
    with pytest.raises(SparkParamError) as caught:
        trigger_run("demo_sleep", {}, trigger="orm", timeout=MAX_RUN_TIMEOUT + 1)
    assert set(caught.value.errors) == {"timeout"}
    with pytest.raises(UnknownSparkJob):
        trigger_run("no_such_job", {}, trigger="orm")
    assert nothing_queued()


def test_the_spark_task_outlives_the_longest_run():
    task = get_task(TASK)
    assert task.queue == "spark"
    assert task.hard_timeout >= MAX_RUN_TIMEOUT and task.hard_timeout == HARD_TIMEOUT
    assert task.min_lease > task.hard_timeout and task.problems() == []


def test_cancel_of_a_queued_run_cancels_it_and_its_item_at_once():
    run = trigger_run("demo_sleep", {}, trigger="orm")
    assert cancel_run(run.id, actor="alice") is True
    run.refresh_from_db()
    assert run.state == "cancelled" and run.finished_at and run.cancel_requested_at
    assert "alice" in run.error
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.CANCELLED
    assert cancel_run(run.id, actor="alice") is False  # final: nothing to cancel


def test_a_running_run_is_asked_to_stop_not_cancelled_outright():
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(state="running")
    assert cancel_run(run.id, actor="bob") is True
    run.refresh_from_db()
    assert run.state == "cancelling" and run.cancel_requested_at and run.finished_at is None
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.READY  # its handler ends it


def test_cancelling_run_items_from_the_queue_side_cancels_their_runs():
    """The item admin's cancel (services.cancel_items) on Spark run items: a queued run ends with its item; a
    started one is asked to stop and keeps its item for the handler to settle; asking again counts nothing."""
    queued = trigger_run("demo_sleep", {}, trigger="orm")
    started = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=started.id).update(state="running")
    plain = QueueItem.objects.get(id=trigger_run("demo_sleep", {}, trigger="orm").item_id)
    SparkRun.objects.filter(item_id=plain.id).update(state="succeeded")  # a finished run: its item is plain

    assert services.cancel_items([queued.item_id, started.item_id, plain.id], actor="dora") == 3
    queued.refresh_from_db()
    started.refresh_from_db()
    assert (queued.state, "dora" in queued.error) == ("cancelled", True)
    assert queued.finished_at and queued.cancel_requested_at
    assert started.state == "cancelling" and started.cancel_requested_at and started.finished_at is None
    states = dict(
        QueueItem.objects.filter(id__in=[queued.item_id, started.item_id, plain.id]).values_list("id", "state")
    )
    assert states == {queued.item_id: "cancelled", started.item_id: "ready", plain.id: "cancelled"}

    assert services.cancel_items([started.item_id], actor="dora") == 0  # asked already
    assert cancel_run(started.id, actor="dora") is False


def test_rerun_queues_the_same_job_and_parameters_from_the_dashboard():
    first = trigger_run("demo_sleep", {"tasks": 2}, trigger="cli", timeout=30)
    again = rerun(first.id, actor="carol")
    assert again.id != first.id and again.item_id != first.item_id
    assert (again.job, again.params, again.timeout) == (first.job, first.params, first.timeout)
    assert (again.trigger, again.requested_by) == ("dashboard", "carol")


def test_the_handler_does_not_start_a_run_cancelled_before_it_started():
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(state="cancelled")
    ctx = Context(
        item_id=run.item_id,
        reservation_id=0,
        attempt=1,
        max_attempts=5,
        task=TASK,
        queue="spark",
        delivery=Delivery.AT_LEAST_ONCE,
        worker_id="test",
    )
    assert get_task(TASK)({"run_id": run.id}, ctx) == {"run_id": run.id, "state": "skipped"}
    run.refresh_from_db()
    assert run.state == "cancelled" and run.attempt == 0 and run.started_at is None


def _group(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *args], start_new_session=True)


def test_an_orphaned_group_of_an_earlier_attempt_is_killed_and_a_stranger_is_not():
    run = trigger_run("demo_sleep", {}, trigger="orm")
    orphan = _group("--run-id", str(run.id))
    stranger = _group("--run-id", str(run.id + 1000))
    try:
        time.sleep(0.2)
        run.driver_host, run.driver_pgid = socket.gethostname(), orphan.pid
        assert kill_orphan(run) is True
        assert orphan.wait(5) == -9 and group_members(orphan.pid) == []

        run.driver_pgid = stranger.pid  # a recycled group id now used by something else
        assert kill_orphan(run) is False
        assert stranger.poll() is None
        run.driver_host = "elsewhere"
        assert kill_orphan(run) is False
    finally:
        for proc in (orphan, stranger):
            proc.kill()
            proc.wait()


def test_cli_rejects_bad_parameters_and_queues_nothing():
    with pytest.raises(CommandError, match="tasks: must be an integer"):
        call_command("spark_run", "demo_sleep", "--param", "tasks=many")
    with pytest.raises(CommandError, match="NAME=VALUE"):
        call_command("spark_run", "demo_sleep", "--param", "tasks")
    with pytest.raises(CommandError, match="unknown Spark job"):
        call_command("spark_run", "nope")
    assert nothing_queued()


def test_cli_triggers_a_run_and_lists_jobs(capsys):
    call_command("spark_run", "demo_sleep", "--param", "tasks=2", "--timeout", "90")
    run = SparkRun.objects.get()
    assert capsys.readouterr().out.strip() == f"run {run.id} queued"  # one line, no bare id before it
    assert (run.trigger, run.params["tasks"], run.timeout) == ("cli", 2, 90.0)
    assert run.get_trigger_display() == "CLI" and triggered(run) == f"triggered from the CLI by {getpass.getuser()}"
    call_command("spark_run", "--list")
    listing = capsys.readouterr().out
    assert "demo_sleep" in listing and "--param tasks=" in listing and "file_rollup" in listing


def test_missing_java_is_a_warning_with_the_install_hint(monkeypatch):
    from queue_app.spark import java

    monkeypatch.setenv("JAVA_HOME", "/nonexistent-java")
    java._probe.cache_clear()
    (warning,) = java_runtime()
    assert warning.id == "jobsite.W010" and warning.level < 40  # a Warning, not an Error
    assert "openjdk-17-jre-headless" in warning.hint


def test_java_present_passes_the_check():
    from queue_app.spark.java import JavaNotFound, check_java

    try:
        check_java()
    except JavaNotFound:
        pytest.skip("no Java here")
    assert java_runtime() == []


def test_cli_cancel_cancels_a_queued_run_with_its_item_as_the_admin_does(capsys):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    call_command("spark_run", "--cancel", str(run.id), "--json")
    out = json.loads(capsys.readouterr().out)
    assert (out["id"], out["state"], out["cancel_requested"]) == (run.id, "cancelled", True)
    assert SparkRun.objects.get(id=run.id).state == "cancelled"
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.CANCELLED


def test_cli_cancel_of_an_ended_run_exits_0_and_says_there_was_nothing_to_cancel(capsys):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(state="succeeded")
    call_command("spark_run", "--cancel", str(run.id))
    assert capsys.readouterr().out.strip() == f"run {run.id} succeeded  (nothing to cancel)"
    call_command("spark_run", "--cancel", str(run.id), "--json")
    out = json.loads(capsys.readouterr().out)
    assert (out["state"], out["cancel_requested"]) == ("succeeded", False)
    assert SparkRun.objects.get(id=run.id).state == "succeeded"


def test_cli_cancel_of_a_started_run_moves_it_to_cancelling(capsys):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    QueueItem.objects.filter(id=run.item_id).update(state=ItemState.RESERVED)
    SparkRun.objects.filter(id=run.id).update(state="running")
    call_command("spark_run", "--cancel", str(run.id))
    assert capsys.readouterr().out.strip() == f"run {run.id} cancelling  (cancel requested)"


def test_cli_cancel_of_an_unknown_run_exits_1(capsys):
    with pytest.raises(CommandError, match="no Spark run 4242"):
        call_command("spark_run", "--cancel", "4242")
    with pytest.raises(SystemExit) as exit_:
        call_command("spark_run", "--cancel", "4242", "--json")
    assert exit_.value.code == 1
    assert json.loads(capsys.readouterr().out) == {"id": 4242, "error": "no Spark run 4242"}
    with pytest.raises(CommandError, match="--cancel ID takes no job"):
        call_command("spark_run", "demo_sleep", "--cancel", "1")


def test_the_trigger_reads_as_a_phrase_on_the_run_page():
    def phrase(trigger: str, who: str = "") -> str:
        return triggered(SparkRun(job="demo_sleep", trigger=trigger, requested_by=who))

    assert phrase("cli") == "triggered from the CLI"
    assert phrase("orm", "ana") == "triggered from code (ORM) by ana"
    assert phrase("dashboard", "admin") == "triggered from the dashboard by admin"
    assert phrase("schedule", "schedule nightly") == "triggered by schedule nightly"
    assert phrase("workflow") == "triggered by a workflow"


def test_the_timing_split_counts_from_queued_and_skips_what_did_not_happen(capsys):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    run.refresh_from_db()
    assert timing_split(run) == []  # no attempt ended yet
    q = run.queued_at.timestamp()
    SparkRun.objects.filter(id=run.id).update(
        state="failed",
        timings={"leased": q + 0.5, "launched": q + 0.75, "driver_up": q + 4.0, "ended": q + 5.0, "recorded": q + 5.25},
    )
    run.refresh_from_db()
    assert [(s["step"], s["after"], s["took"]) for s in timing_split(run)] == [
        ("queued", 0.0, None),
        ("leased", 0.5, 0.5),
        ("launched", 0.75, 0.25),
        ("driver_up", 4.0, 3.25),  # no task ever ran: first and last task are left out
        ("ended", 5.0, 1.0),
        ("recorded", 5.25, 0.25),
    ]
    call_command("spark_run", "--cancel", str(run.id), "--json")
    assert json.loads(capsys.readouterr().out)["timings"] == {
        "queued": 0.0,
        "leased": 0.5,
        "launched": 0.75,
        "driver_up": 4.0,
        "ended": 5.0,
        "recorded": 5.25,
    }
