"""Django's own task API (`django.tasks`) on jobsite's queue, end to end: `@task` functions in
tests/tasks/django_tasks_app.py, enqueued here and run by real `manage.py run_worker` processes.

jobsite/settings.py makes QueueBackend the default backend, so these tests use no override."""

import json
import traceback
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import connections, transaction
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.checks import check_tasks
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.test import override_settings
from django.utils import timezone

from queue_app.models import DeadLetter, ItemState, QueueItem
from queue_app.registry import find_task
from queue_app.tasks_backend import JobsiteTask, QueueBackend, exception_path, run_django_task
from tests.support.waiting import wait_for
from tests.tasks import django_tasks_app as app


class Rollback(Exception):
    pass


@pytest.fixture
def enqueued():
    """task_enqueued signals received in this process."""
    seen = []

    def receive(sender, task_result, **kwargs):
        seen.append(task_result)

    task_enqueued.connect(receive)
    yield seen
    task_enqueued.disconnect(receive)


@pytest.fixture
def signal_log(tmp_path) -> Path:
    return tmp_path / "signals.jsonl"


@pytest.fixture
def burst(manage, signal_log):
    """Run `run_worker --burst` (one handler at a time, one item per lease) to completion."""

    def run(*args: str, env: dict[str, str] | None = None):
        result = manage(
            "run_worker",
            "--burst",
            "--concurrency",
            "1",
            "--batch",
            "1",
            "--no-scheduler",
            *args,
            env={app.SIGNAL_LOG_ENV: str(signal_log), **(env or {})},
            timeout=90,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    return run


@pytest.fixture
def worker(spawn, signal_log):
    """A long-running worker (for retries, which a burst worker would not wait for) with fast backoff."""

    def start():
        return spawn(
            "run_worker",
            "--concurrency",
            "1",
            "--poll-interval",
            "0.1",
            "--no-scheduler",
            env={app.SIGNAL_LOG_ENV: str(signal_log), "JOBSITE_BACKOFF_BASE": "0.05"},
        )

    return start


def signals(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- the worker runs django.tasks -----------------------------------------------------------------------------

transactional = pytest.mark.django_db(transaction=True)


@transactional
@pytest.mark.slow  # real run_worker processes
def test_enqueue_in_a_rolled_back_transaction_queues_and_runs_nothing(burst, signal_log, enqueued):
    with pytest.raises(Rollback), transaction.atomic():
        app.add.enqueue(1, 2)
        raise Rollback
    assert not QueueItem.objects.exists()
    assert enqueued == []
    burst()
    assert signals(signal_log) == []


@transactional
@pytest.mark.slow  # real run_worker processes
def test_committed_enqueue_runs_in_the_worker_and_reports_successful_with_its_value(burst, enqueued):
    with transaction.atomic():
        result = app.add.enqueue(2, 3)
        assert enqueued == []  # "enqueued" is said on commit
    assert [r.id for r in enqueued] == [result.id]
    assert result.status == TaskResultStatus.READY
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == [] and len(result.worker_ids) == 1
    assert result.started_at <= result.finished_at
    fetched = app.add.get_result(result.id)
    assert (fetched.args, fetched.return_value) == ([2, 3], 5)
    assert QueueItem.objects.get(id=int(result.id)).task == "tests.tasks.django_tasks_app.add"


@transactional
@pytest.mark.slow  # real run_worker processes
def test_worker_sends_task_started_and_task_finished_in_its_own_process(burst, signal_log):
    import os

    result = app.add.enqueue(1, 1)
    burst()
    sent = signals(signal_log)
    assert [(s["signal"], s["status"], s["id"]) for s in sent] == [
        ("task_started", "RUNNING", result.id),
        ("task_finished", "SUCCESSFUL", result.id),
    ]
    assert sent[0]["pid"] != os.getpid()


@transactional
@pytest.mark.slow  # real run_worker processes
def test_failing_task_is_retried_then_failed_with_each_attempts_error_and_worker(worker, signal_log):
    result = app.explode.enqueue("no luck")
    proc = worker()
    wait_for(lambda: app.explode.get_result(result.id).is_finished, timeout=60, what="the task to finish")
    proc.terminate()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["tests.tasks.django_tasks_app.Boom"] * 2
    assert result.errors[0].exception_class is app.Boom
    assert "Boom: no luck" in result.errors[-1].traceback
    assert len(result.worker_ids) == 2 and result.attempts == 2
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    finished = [s for s in signals(signal_log) if s["signal"] == "task_finished"]
    assert [s["status"] for s in finished] == ["FAILED", "FAILED"]
    assert finished[-1]["errors"][-1] == "tests.tasks.django_tasks_app.Boom"
    assert DeadLetter.objects.filter(item_id=int(result.id)).exists()


@transactional
@pytest.mark.slow  # real run_worker processes
def test_takes_context_sees_the_attempt_number(worker):
    result = app.flaky.enqueue(succeed_on=2)
    proc = worker()
    wait_for(lambda: app.flaky.get_result(result.id).is_finished, timeout=60, what="the task to finish")
    proc.terminate()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 2}
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]


@transactional
@pytest.mark.slow  # real run_worker processes
def test_run_after_is_honoured(burst):
    # Not before: an item due in 10 minutes is left alone by a burst run however slowly the worker starts (a
    # near run_after raced the worker's start-up under load). After: one due in a second runs once it is due.
    later = app.add.using(run_after=timezone.now() + timedelta(minutes=10)).enqueue(2, 2)
    run_after = timezone.now() + timedelta(seconds=1)
    soon = app.add.using(run_after=run_after).enqueue(1, 1)
    wait_for(lambda: timezone.now() >= run_after, timeout=10, what="run_after")
    burst()  # runs the due item, finds the other not due, stops
    soon.refresh()
    later.refresh()
    assert soon.status == TaskResultStatus.SUCCESSFUL
    assert soon.started_at >= run_after
    assert later.status == TaskResultStatus.READY and later.worker_ids == []


@transactional
@pytest.mark.slow  # real run_worker processes
def test_higher_priority_runs_first(burst):
    with transaction.atomic():
        low = app.stamp.using(priority=-10).enqueue("low")
        normal = app.stamp.enqueue("normal")
        high = app.stamp.using(priority=50).enqueue("high")
    burst()
    results = [app.stamp.get_result(r.id) for r in (low, normal, high)]
    order = sorted(results, key=lambda r: r.return_value["at"])
    assert [r.return_value["tag"] for r in order] == ["high", "normal", "low"]


@transactional
@pytest.mark.slow  # real run_worker processes
def test_async_task_runs(burst):
    result = app.double.enqueue(21)
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42


@transactional
@pytest.mark.slow  # real run_worker processes
def test_names_that_are_neither_a_job_nor_a_django_task_go_to_the_dead_letters(burst):
    from queue_app import engine

    ids = [
        engine.enqueue(name, {}).id
        for name in (
            "tests.tasks.django_tasks_app.not_a_task",
            "tests.tasks.django_tasks_app.missing",
            "nowhere.at.all",
        )
    ]
    burst()
    for item_id in ids:
        item = QueueItem.objects.get(id=item_id)
        assert item.state == ItemState.DEAD
        assert DeadLetter.objects.get(item_id=item_id).reason.startswith("unknown task: ")


# -- enqueue and get_result in this process ---------------------------------------------------------------------


def test_jobsite_options_ride_on_the_task_and_reach_the_item(db):
    assert isinstance(app.explode, JobsiteTask) and app.explode.max_attempts == 2
    keyed = app.add.using(dedup_key="add-1", ordering_key="adds", priority=5, queue_name="math")
    assert keyed.priority == 5 and keyed.dedup_key == "add-1"
    first = keyed.enqueue(1, 2)
    second = keyed.enqueue(1, 2)
    assert second.id == first.id  # the dedup window returned the first item
    item = QueueItem.objects.get(id=int(first.id))
    assert (item.queue_id, item.priority, item.dedup_key, item.ordering_key) == ("math", 5, "add-1", "adds")
    assert QueueItem.objects.get(id=int(app.explode.enqueue("x").id)).max_attempts == 2


def test_the_worker_finds_a_django_task_by_its_module_path(db):
    spec = find_task("tests.tasks.django_tasks_app.explode")
    assert spec.func is run_django_task and spec.max_attempts == 2
    assert find_task("tests.tasks.django_tasks_app.explode") is spec  # resolved once, then cached
    assert find_task("tests.tasks.django_tasks_app.not_a_task") is None


def test_get_result_of_an_unknown_or_foreign_id_does_not_exist(db):
    from queue_app import engine

    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("999999999")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-number")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(engine.enqueue("queue_app.noop").id))


def test_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, QueueBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_backend_init_touches_no_database():
    # No django_db mark: pytest-django fails any query made here.
    backend = QueueBackend("other", {"QUEUES": ["default"], "OPTIONS": {"DATABASE": "default"}})
    assert backend.queues == {"default"} and backend.using_db == "default"
    assert backend.check() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delivery": "twice"}, "delivery must be one of"),
        ({"hard_timeout": 30, "lease_timeout": 20}, "must be longer than hard_timeout"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"delivery": "at_most_once", "max_attempts": 3}, "at-most-once task is never retried"),
        ({"hard_timeout": -1}, "hard_timeout must be > 0"),
        ({"queue_name": "no spaces please"}, "queue name must match"),
    ],
)
def test_jobsite_task_options_are_validated(options, message):
    with pytest.raises(InvalidTask, match=message):
        task(**options)(app.add.func)


def test_jobsite_task_options_valid_at_most_once():
    at_most_once = task(delivery="at_most_once", hard_timeout=5, lease_timeout=30)(app.add.func)
    assert at_most_once.job_spec().max_attempts == 1


def _errors(**tasks_options) -> list[str]:
    with override_settings(TASKS={"default": {"BACKEND": "queue_app.tasks_backend.QueueBackend", **tasks_options}}):
        return sorted(m.id for m in check_tasks())


def test_system_check_reports_bad_queue_names_and_unknown_options():
    assert _errors(QUEUES=["default", "bad name!"], OPTIONS={"RETRIES": 3}) == ["jobsite.E001", "jobsite.E002"]
    assert _errors(QUEUES=[]) == []


def test_system_check_reports_a_database_that_is_missing_or_not_postgresql(monkeypatch):
    assert _errors(OPTIONS={"DATABASE": "nowhere"}) == ["jobsite.E003"]
    monkeypatch.setitem(connections.settings, "lite", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    assert _errors(OPTIONS={"DATABASE": "lite"}) == ["jobsite.E004"]


# -- error class paths ------------------------------------------------------------------------------------------


def _failed_attempt(exc: BaseException, outcome: str = "retry") -> SimpleNamespace:
    try:
        raise exc
    except BaseException as raised:
        tb = traceback.format_exc()
        return SimpleNamespace(outcome=outcome, error=f"{type(raised).__name__}: {raised}", traceback=tb)


def test_exception_path_of_builtin_and_project_exceptions():
    assert exception_path(_failed_attempt(ValueError("bad"))) == "builtins.ValueError"
    assert exception_path(_failed_attempt(app.Boom("multi\nline: message"))) == "tests.tasks.django_tasks_app.Boom"


def test_exception_path_of_a_chained_exception_is_the_last_one_raised():
    try:
        try:
            raise KeyError("first")
        except KeyError as exc:
            raise app.Boom("second") from exc
    except app.Boom:
        attempt = SimpleNamespace(outcome="dead", error="Boom: second", traceback=traceback.format_exc())
    assert exception_path(attempt) == "tests.tasks.django_tasks_app.Boom"


def test_exception_path_without_a_traceback():
    timed_out = SimpleNamespace(outcome="timed_out", error="hard timeout: ...", traceback="")
    assert exception_path(timed_out) == "builtins.TimeoutError"
    poison = SimpleNamespace(outcome="dead", error="unknown task: x.y", traceback="")
    assert exception_path(poison) == "builtins.Exception"
    named = SimpleNamespace(outcome="retry", error="KeyError: 'k'", traceback="")
    assert exception_path(named) == "builtins.KeyError"


def test_a_plain_django_task_object_runs_with_jobsite_defaults(db):
    from django.tasks import Task

    plain = Task(func=app.add.func, queue_name="plain", priority=3)
    item = QueueItem.objects.get(id=int(plain.enqueue(1, 2).id))
    assert (item.queue_id, item.priority, item.task) == ("plain", 3, "tests.tasks.django_tasks_app.add")
