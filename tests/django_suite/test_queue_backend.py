"""Django 6.1.3's tests/tasks/test_immediate_backend.py (from its source distribution), run against jobsite's
QueueBackend. The immediate backend runs a task inside enqueue(); QueueBackend queues it, so every test that
expects a finished result first runs a real `manage.py run_worker --burst` and refreshes the result: that is
the one adaptation throughout ("jobsite: worker"). Other adaptations are marked "jobsite:" with the reason:
- task_started/task_finished are logged by the worker's process, so assertLogs on them reads the worker's
  output instead of capturing this process's log records;
- a failing task is retried by jobsite (the queue's max_attempts, 5); the queue is given one attempt so that a
  failure is final, as it is in the immediate backend;
- where the immediate backend documents what it cannot do (get_result, refresh, run_after, wait for commit),
  the test asserts what QueueBackend does instead;
- a KeyboardInterrupt raised by a task is recorded as its failure in the worker (it cannot reach the caller).
The class is a TransactionTestCase (Django's is a SimpleTestCase): the worker reads committed rows."""

import subprocess
import sys

from asgiref.sync import sync_to_async
import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.test import TransactionTestCase, override_settings
from django.utils import timezone

from queue_app import engine, services
from queue_app.tasks_backend import QueueBackend
from tests.conftest import ROOT, child_env

from . import tasks as test_tasks


def run_worker() -> str:
    """jobsite: worker. Run every due item to its end in a real worker process; returns its output."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "run_worker", "--burst", "--concurrency", "1", "--no-scheduler"],
        cwd=ROOT,
        env=child_env(connection.settings_dict["NAME"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def worker_logs(output: str, result_id: str) -> list[str]:
    """jobsite: the worker's django.tasks log lines about one result (the records assertLogs would capture)."""
    return [line for line in output.splitlines() if " django.tasks " in line and f"Task id={result_id} " in line]


@override_settings(
    TASKS={
        "default": {
            # jobsite: QueueBackend in the immediate backend's place.
            "BACKEND": "queue_app.tasks_backend.QueueBackend",
            "QUEUES": [],
        }
    }
)
@pytest.mark.slow
class QueueBackendTestCase(TransactionTestCase):
    available_apps = ["queue_app"]

    def setUp(self):
        # jobsite: one attempt, so a failure is final as in the immediate backend (jobsite retries by default).
        engine.ensure_queue("default")
        services.set_queue_options("default", max_attempts=1)

    def test_using_correct_backend(self):
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], QueueBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, {})

    def test_enqueue_task(self):
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = task.enqueue(1, two=3)
                run_worker()  # jobsite: worker
                result.refresh()

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertIsNone(result.return_value)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(result.attempts, 1)

    async def test_enqueue_task_async(self):
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = await task.aenqueue()
                await sync_to_async(run_worker)()  # jobsite: worker
                await result.arefresh()

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertIsNone(result.return_value)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(result.attempts, 1)

    def test_catches_exception(self):
        test_data = [
            (
                test_tasks.failing_task_value_error,  # Task function.
                ValueError,  # Expected exception.
                "This Task failed due to ValueError",  # Expected message.
            ),
            (
                test_tasks.failing_task_system_exit,
                SystemExit,
                "This Task failed due to SystemExit",
            ),
        ]
        for task, exception, message in test_data:
            with self.subTest(task):
                result = task.enqueue()
                output = run_worker()  # jobsite: worker
                result.refresh()

                # jobsite: the worker's log lines, not assertLogs (the task ran in the worker's process).
                failed = [line for line in worker_logs(output, result.id) if " ERROR " in line]
                self.assertEqual(len(failed), 1)
                self.assertIn(message, output)

                self.assertEqual(result.status, TaskResultStatus.FAILED)
                with self.assertRaisesMessage(ValueError, "Task failed"):
                    result.return_value
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertEqual(result.errors[0].exception_class, exception)
                traceback = result.errors[0].traceback
                self.assertIs(
                    traceback and traceback.endswith(f"{exception.__name__}: {message}\n"),
                    True,
                    traceback,
                )
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})

    def test_throws_keyboard_interrupt(self):
        # jobsite: the immediate backend raises it in the caller; in a queue it happens in the worker, which
        # records it as the attempt's failure with its class and traceback (and carries on).
        result = default_task_backend.enqueue(test_tasks.failing_task_keyboard_interrupt, [], {})
        run_worker()
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, KeyboardInterrupt)
        self.assertTrue(
            result.errors[0].traceback.endswith("KeyboardInterrupt: This Task failed due to KeyboardInterrupt\n")
        )

    def test_complex_exception(self):
        result = test_tasks.complex_exception.enqueue()
        run_worker()  # jobsite: worker (its ERROR log line is in the worker's output)
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)

        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn('ValueError(ValueError("This task failed"))', result.errors[0].traceback)

        self.assertEqual(result.task, test_tasks.complex_exception)
        self.assertEqual(result.args, [])
        self.assertEqual(result.kwargs, {})

    def test_complex_return_value(self):
        result = test_tasks.complex_return_value.enqueue()
        run_worker()  # jobsite: worker
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)
        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, TypeError)
        self.assertIn("Unsupported type", result.errors[0].traceback)

    def test_result(self):
        result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
        run_worker()  # jobsite: worker
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    async def test_result_async(self):
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, [], {})
        await sync_to_async(run_worker)()  # jobsite: worker
        await result.arefresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    async def test_get_result(self):
        # jobsite: in place of test_cannot_get_result: QueueBackend reads results back.
        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("123")
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, (), {})
        self.assertEqual(await default_task_backend.aget_result(result.id), result)

    async def test_refresh_result(self):
        # jobsite: in place of test_cannot_refresh_result.
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, (), {})
        await sync_to_async(run_worker)()
        self.assertEqual(result.status, TaskResultStatus.READY)
        await result.arefresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_run_after(self):
        # jobsite: in place of test_cannot_pass_run_after: QueueBackend supports run_after (supports_defer).
        later = timezone.now() + timezone.timedelta(hours=1)
        default_task_backend.validate_task(test_tasks.failing_task_value_error.using(run_after=later))
        result = test_tasks.calculate_meaning_of_life.using(run_after=later).enqueue()
        run_worker()
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.READY)  # not due yet: not run

    def test_enqueue_logs(self):
        with self.assertLogs("django.tasks", level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()
        output = run_worker()  # jobsite: worker; its log lines are the rest of what assertLogs captured

        self.assertEqual(len(captured_logs.output), 1)
        self.assertIn("enqueued", captured_logs.output[0])
        self.assertIn(result.id, captured_logs.output[0])

        logged = worker_logs(output, result.id)
        self.assertEqual(len(logged), 2)
        self.assertIn("state=RUNNING", logged[0])
        self.assertIn("state=SUCCESSFUL", logged[1])

    def test_failed_logs(self):
        result = test_tasks.failing_task_value_error.enqueue()
        logged = worker_logs(run_worker(), result.id)  # jobsite: worker (see test_enqueue_logs)

        self.assertEqual(len(logged), 2)
        self.assertIn("state=RUNNING", logged[0])
        self.assertIn("state=FAILED", logged[1])

    def test_successful_task_no_none_in_logs(self):
        result = test_tasks.noop_task.enqueue()
        logged = worker_logs(run_worker(), result.id)  # jobsite: worker (see test_enqueue_logs)
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertTrue(logged)
        for log_output in logged:
            self.assertNotIn("None", log_output)

    def test_takes_context(self):
        result = test_tasks.get_task_id.enqueue()
        run_worker()  # jobsite: worker
        result.refresh()

        self.assertEqual(result.return_value, result.id)

    def test_context(self):
        result = test_tasks.test_context.enqueue(1)
        run_worker()  # jobsite: worker
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_validate_on_enqueue(self):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with override_settings(
            TASKS={
                "default": {
                    "BACKEND": "queue_app.tasks_backend.QueueBackend",
                    "QUEUES": ["queue-1"],
                }
            }
        ):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid for backend"):
                task_with_custom_queue_name.enqueue()

    async def test_validate_on_aenqueue(self):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

        with override_settings(
            TASKS={
                "default": {
                    "BACKEND": "queue_app.tasks_backend.QueueBackend",
                    "QUEUES": ["queue-1"],
                }
            }
        ):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid for backend"):
                await task_with_custom_queue_name.aenqueue()


@pytest.mark.slow
class QueueBackendTransactionTestCase(TransactionTestCase):
    available_apps = ["queue_app"]

    @override_settings(TASKS={"default": {"BACKEND": "queue_app.tasks_backend.QueueBackend"}})
    def test_waits_until_transaction_commit(self):
        # jobsite: in place of test_doesnt_wait_until_transaction_commit_by_default: QueueBackend's enqueue
        # joins the caller's transaction, so nothing runs before the commit, and the item is there after it.
        with transaction.atomic():
            result = test_tasks.noop_task.enqueue()

            self.assertIsNotNone(result.enqueued_at)
            self.assertEqual(result.status, TaskResultStatus.READY)

        run_worker()
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
