"""Spark runs through a real worker (`manage.py run_worker --queues spark`) and real spark-submit children:
live progress on the row, cancel, and a worker killed -9 mid-run whose run comes back without duplicating its
output or leaving a process behind.

One JVM at a time: each test starts one worker with concurrency 1.
"""

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from queue_app import services
from queue_app.models import ItemState, QueueItem, Worker
from queue_app.spark.pipelines.file_rollup import write_sample_input
from queue_app.spark.runs import TIMING_STEPS, cancel_run, timing_split, trigger_run
from queue_app.spark.watch import group_members
from tests.support import spark_workers
from tests.support.spark_fixtures import require_spark
from tests.support.spark_workers import final, row, tasks_running
from tests.support.waiting import wait_for

spark_worker = spark_workers.spark_worker  # the fixture

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _spark_available():
    require_spark()


def test_run_through_a_worker_reports_progress_while_running_and_metrics_at_the_end(spark_worker, record_property):
    spark_worker()
    t0 = time.monotonic()
    run = trigger_run("demo_sleep", {"tasks": 6, "seconds": 1.5}, trigger="orm", requested_by="test")
    assert run.state == "queued" and run.item_id
    seen_states, mid_run, first_task_at = set(), None, None
    while time.monotonic() - t0 < 120:
        current = row(run.id)
        seen_states.add(current.state)
        done, total = current.progress.get("tasks_done", 0), current.progress.get("tasks_total", 0)
        if first_task_at is None and done > 0:
            first_task_at = time.monotonic() - t0
        if current.state == "running" and 0 < done < total:
            mid_run = dict(current.progress)
        if current.is_final:
            break
        time.sleep(0.1)
    record_property("trigger_to_first_task_seconds", round(first_task_at or -1, 2))
    print(f"trigger -> first task done, through the worker: {first_task_at:.2f}s")

    run = row(run.id)
    assert run.state == "succeeded", (run.error, run.log_tail[-2000:])
    assert {"starting", "running"} <= seen_states
    assert mid_run is not None, "no progress with some but not all tasks done was seen while running"
    assert run.metrics == {"tasks": 6, "sum": 15}
    assert run.progress["tasks_done"] == run.progress["tasks_total"] == 6
    assert run.attempt == 1 and run.app_id.startswith("local-")
    assert run.driver_host == socket.gethostname() and run.driver_pgid
    assert run.log_tail and len(run.log_tail) <= 20_000
    assert run.started_at and run.finished_at > run.started_at
    # Its split, as the launcher saw the child (a registered function prints its own STARTED and progress).
    split = timing_split(run)
    assert [s["step"] for s in split] == [step for step, _ in TIMING_STEPS], split
    assert [s["after"] for s in split] == sorted(s["after"] for s in split), split
    # The item settled with the run's end, in its transaction: a final run never has its item still held.
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.DONE
    assert group_members(run.driver_pgid) == []


def test_cancel_stops_the_run_and_its_process_group(spark_worker):
    spark_worker()
    run = trigger_run("demo_sleep", {"tasks": 2, "seconds": 120}, trigger="orm")
    running = tasks_running(run.id)
    pgid = running.driver_pgid
    assert group_members(pgid)

    assert cancel_run(run.id, actor="tester") is True
    assert row(run.id).state == "cancelling"
    assert cancel_run(run.id, actor="tester") is False  # asked already

    ended = wait_for(lambda: final(run.id), 60, what="the run to end")
    assert ended.state == "cancelled"
    assert ended.cancel_requested_at and ended.finished_at
    assert group_members(pgid) == []
    # Cancelled is an end, not a failure: the item is settled cancelled (not done), never retried.
    item = QueueItem.objects.get(id=run.item_id)
    assert item.state == ItemState.CANCELLED and item.reservation.outcome == "cancelled"
    # The worker's own settle of that reservation comes after the handler returned: it finds the reservation no
    # longer current (its row counts it stale) and changes nothing.
    wait_for(
        lambda: Worker.objects.filter(stats__stale__gte=1).exists(), 60, what="the worker to find its settle stale"
    )
    item = QueueItem.objects.get(id=run.item_id)
    assert item.state == ItemState.CANCELLED and item.reservation.outcome == "cancelled"
    assert row(run.id).state == "cancelled"


def test_cancelling_the_runs_queue_item_stops_the_run_like_the_dashboard(spark_worker):
    """The item admin's cancel on a running Spark run's item: the run's handler stops the child's process group
    and records the run cancelled (not left `running` under a killed handler)."""
    spark_worker()
    run = trigger_run("demo_sleep", {"tasks": 2, "seconds": 120}, trigger="orm")
    running = tasks_running(run.id)
    assert group_members(running.driver_pgid)

    assert services.cancel_items([run.item_id], actor="queue admin") == 1
    ended = wait_for(lambda: final(run.id), 60, what="the run to end")
    assert ended.state == "cancelled" and ended.cancel_requested_at and ended.finished_at
    assert group_members(running.driver_pgid) == []
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.CANCELLED


def test_worker_killed_mid_run_redelivers_the_run_without_duplicating_its_output(spark_worker, tmp_path):
    input_dir, output_dir = tmp_path / "in", tmp_path / "out"
    write_sample_input(str(input_dir), rows=3000, days=3)
    # The run's lease is its hard timeout and a margin (an hour and more, see runs.py); what brings it back after
    # a kill -9 is the killed worker's silence: the second worker rescues the leases of a worker silent for
    # WORKER_LOST_AFTER seconds, 10 here instead of 60 (the first beats every 3.3 s). Before this, the test
    # waited for a shortened lease to expire, 86 s after the kill.
    quick = {"JOBSITE_WORKER_LOST_AFTER": "10"}
    first = spark_worker(**quick)
    run = trigger_run(
        "file_rollup", {"input_dir": str(input_dir), "output_dir": str(output_dir)}, trigger="orm", requested_by="t"
    )
    # Kill the worker right after the first attempt wrote its output, before it could mark the run succeeded.
    wait_for(lambda: len(_parquet_files(output_dir)) == 3, 120, interval=0.02, what="the first attempt's output")
    first_files = _parquet_files(output_dir)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    killed = row(run.id)
    assert killed.state == "running" and killed.attempt == 1
    wait_for(lambda: not group_members(killed.driver_pgid), 15, what="the first attempt's processes to die")

    spark_worker(**quick)
    ended = wait_for(lambda: final(run.id), 150, interval=0.5, what="the re-delivered run to end")
    assert ended.state == "succeeded", (ended.error, ended.log_tail[-2000:])
    assert ended.attempt == 2
    assert ended.metrics["days"] == ["2025-01-01", "2025-01-02", "2025-01-03"]
    days = sorted(p.name for p in output_dir.iterdir() if p.is_dir())
    assert days == ["event_date=2025-01-01", "event_date=2025-01-02", "event_date=2025-01-03"]
    files = _parquet_files(output_dir)
    # One file per day: the second attempt replaced the first one's files (dynamic partition overwrite), added none.
    assert len(files) == 3 and {f.parent.name for f in files} == set(days)
    assert not set(files) & set(first_files)
    assert not [p for p in output_dir.iterdir() if p.name.startswith(".spark-staging")]
    assert group_members(ended.driver_pgid) == []
    assert not _processes_of_run(run.id)


def _parquet_files(output_dir: Path) -> list[Path]:
    # Dynamic partition overwrite writes no _SUCCESS marker; a day's file appears when the job commits.
    return sorted(output_dir.glob("event_date=*/part-*.parquet")) if output_dir.exists() else []


def _processes_of_run(run_id: int) -> list[int]:
    from queue_app.spark.runs import _belongs_to_run

    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _belongs_to_run(int(p.name), run_id)]
