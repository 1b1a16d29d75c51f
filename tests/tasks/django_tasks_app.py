"""django.tasks functions for tests/core/processes/test_tasks_backend.py, run by real workers through jobsite's
QueueBackend.

A worker finds them by module path ("tests.tasks.django_tasks_app.add"); nothing registers them. When the worker's
environment sets TASK_SIGNAL_LOG, the task_started and task_finished receivers below append one JSON line per
signal to that file, so the test process can see what the worker process sent.
"""

import json
import os
import signal
import time

from django.dispatch import receiver
from django.tasks import task
from django.tasks.signals import task_finished, task_started

SIGNAL_LOG_ENV = "TASK_SIGNAL_LOG"


class Boom(Exception):
    """What `explode` raises: a non-builtin exception, so its class path has a module."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task(max_attempts=2)
def explode(message: str) -> None:
    raise Boom(message)


@task(max_attempts=3, takes_context=True)
def flaky(context, succeed_on: int) -> dict[str, int]:
    """Fails until attempt `succeed_on`; returns the attempt it succeeded on (from the TaskContext)."""
    if context.attempt < succeed_on:
        raise ValueError(f"attempt {context.attempt} fails on purpose")
    return {"attempt": context.attempt}


@task
def stamp(tag: str) -> dict[str, object]:
    return {"tag": tag, "at": time.time()}


@task
async def double(x: int) -> int:
    return 2 * x


@task(max_attempts=1)
def leave(code: int) -> None:
    """Raises SystemExit: a BaseException that is not an Exception."""
    raise SystemExit(code)


@task(max_attempts=1)
def interrupt(message: str) -> None:
    raise KeyboardInterrupt(message)


@task(max_attempts=1)
def die_by_signal() -> None:
    """Kills the process running it (a worker child) with SIGKILL, as the OOM killer would."""
    os.kill(os.getpid(), signal.SIGKILL)


@task(delivery="at_most_once")
def notify_once(message: str) -> str:
    return message


def not_a_task(payload, ctx) -> None:
    """A plain function: a queue item naming it must go to the dead letters as an unknown task."""


def _log_signal(name: str, task_result) -> None:
    path = os.environ.get(SIGNAL_LOG_ENV)
    if not path:
        return
    record = {
        "signal": name,
        "id": task_result.id,
        "task": task_result.task.module_path,
        "status": str(task_result.status),
        "pid": os.getpid(),
        "errors": [e.exception_class_path for e in task_result.errors],
    }
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


@receiver(task_started)
def _on_started(sender, task_result, **kwargs) -> None:
    _log_signal("task_started", task_result)


@receiver(task_finished)
def _on_finished(sender, task_result, **kwargs) -> None:
    _log_signal("task_finished", task_result)
