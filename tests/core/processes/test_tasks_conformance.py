"""Where jobsite's QueueBackend must behave as Django documents `django.tasks` backends: the stored enqueue time
is the one returned, QUEUES defaults to ["default"], and a task raising SystemExit or KeyboardInterrupt is
recorded with its real class and traceback under both pools (a child killed by a signal: named). Real
`run_worker` processes run the tasks."""

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

from queue_app.models import QueueItem
from queue_app.tasks_backend import QueueBackend
from tests.tasks import django_tasks_app as app

transactional = pytest.mark.django_db(transaction=True)


@pytest.fixture
def burst(manage):
    def run(*args: str):
        result = manage("run_worker", "--burst", "--concurrency", "1", "--no-scheduler", *args, timeout=90)
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    return run


# -- enqueued_at ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueued_at_returned_is_the_stored_one_inside_an_old_transaction():
    with transaction.atomic():
        first = app.add.enqueue(1, 1)  # the transaction's clock starts no later than here
        import time

        time.sleep(0.05)
        result = app.add.enqueue(2, 2)
        stored = QueueItem.objects.get(id=int(result.id)).created_at
        assert result.enqueued_at == stored
        assert app.add.get_result(result.id) == result
        assert app.add.get_result(first.id) == first


@transactional
def test_refresh_keeps_enqueued_at():
    result = app.add.enqueue(1, 2)
    before = result.enqueued_at
    result.refresh()
    assert result.enqueued_at == before
    assert app.add.get_result(result.id) == result


@transactional
def test_a_duplicate_enqueue_returns_the_stored_first_result():
    first = app.add.using(dedup_key="conf-1").enqueue(1, 2)
    again = app.add.using(dedup_key="conf-1").enqueue(1, 2)
    assert again.id == first.id and again.enqueued_at == first.enqueued_at


# -- QUEUES ---------------------------------------------------------------------------------------------------


def test_queues_left_out_accept_only_the_default_queue():
    backend = QueueBackend("x", {"OPTIONS": {}})
    assert backend.queues == {"default"}
    with pytest.raises(InvalidTask, match="Queue 'reports' is not valid for backend"):
        backend.validate_task(app.add.using(queue_name="reports"))
    backend.validate_task(app.add)  # "default" is fine


@pytest.mark.django_db
def test_an_explicit_empty_queues_list_accepts_any_queue():
    backend = QueueBackend("x", {"QUEUES": [], "OPTIONS": {}})
    result = backend.enqueue(app.add.using(queue_name="reports"), (1, 2), {})
    item = QueueItem.objects.get(id=int(result.id))
    assert (item.queue_id, item.payload["args"]) == ("reports", [1, 2])


@transactional
def test_enqueue_to_a_queue_outside_the_default_writes_nothing():
    tasks = {"default": {"BACKEND": "queue_app.tasks_backend.QueueBackend"}}
    with override_settings(TASKS=tasks):
        task_backends._settings = None  # re-read TASKS
        try:
            with pytest.raises(InvalidTask, match="not valid"):
                app.add.using(queue_name="reports").enqueue(1, 2)
        finally:
            task_backends._settings = None
    assert not QueueItem.objects.exists()


# -- BaseException subclasses ---------------------------------------------------------------------------------


@transactional
@pytest.mark.parametrize("pool", ["process", "thread"])
@pytest.mark.slow  # real run_worker processes
def test_system_exit_and_keyboard_interrupt_are_recorded_with_class_and_traceback(burst, pool):
    left = app.leave.enqueue(3)
    stopped = app.interrupt.enqueue("stopped by the handler")
    after = app.add.enqueue(20, 22)  # the worker carries on (a fresh child in the process pool)
    run = burst("--pool", pool)
    for result, path, message in (
        (left, "builtins.SystemExit", "SystemExit: 3"),
        (stopped, "builtins.KeyboardInterrupt", "KeyboardInterrupt: stopped by the handler"),
    ):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        [error] = result.errors
        assert error.exception_class_path == path
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert message in error.traceback
        assert "django_tasks_app.py" in error.traceback
    after.refresh()
    assert after.status == TaskResultStatus.SUCCESSFUL and after.return_value == 42
    # Recorded, not also printed by the dying child: the only tracebacks in the worker's output are those of
    # django.tasks' own "state=FAILED" log lines (one per failed task, as Django's backends log them).
    output = run.stdout + run.stderr
    assert "jobsite-worker-child" not in output
    assert output.count("Traceback (most recent call last)") == output.count("state=FAILED") == 2, output


@transactional
@pytest.mark.slow  # real run_worker processes
def test_a_child_killed_by_a_signal_is_recorded_naming_the_signal(burst):
    result = app.die_by_signal.enqueue()
    burst("--pool", "process")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert "was killed by SIGKILL" in error.traceback


@transactional
@pytest.mark.slow  # real run_worker processes
def test_each_django_tasks_log_line_is_printed_once(burst):
    result = app.add.enqueue(1, 2)
    run = burst()
    lines = [line for line in (run.stdout + run.stderr).splitlines() if f"Task id={result.id} " in line]
    assert len(lines) == 2, lines  # started and finished, once each
    assert all(" INFO django.tasks " in line for line in lines), lines
