"""A Django 6 `django.tasks` backend on top of the engine: any `@task` runs through jobsite's queue.

    TASKS = {"default": {"BACKEND": "queue_app.tasks_backend.QueueBackend", "QUEUES": []}}

    @task(priority=10, max_attempts=3, delivery="transactional")   # jobsite options ride on JobsiteTask
    def send_invoice(order_id): ...

    with transaction.atomic():
        result = send_invoice.using(dedup_key=f"invoice-{order.id}").enqueue(order.id)  # joins the transaction

An item's task name is the function's module path; the worker resolves it to the `Task` object, so a task
needs no other registration. `get_result()` reads the item and its reservations (one TaskError per failed
attempt, one worker id per attempt).
"""

import builtins
import re
import traceback as tb
from dataclasses import dataclass, replace
from typing import Any

from django.core import checks
from django.db import connections
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskContext, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from . import engine
from .conf import queue_settings
from .engine.alias import on_commit, queue_db
from .engine.enqueue import QUEUE_NAME
from .registry import DEFAULT_HARD_TIMEOUT, LEASE_MARGIN, Context, Delivery, Retry, _check_seconds
from .registry import Task as JobSpec

STATUS = {
    "ready": TaskResultStatus.READY,
    "reserved": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
FAILED_OUTCOMES = ("retry", "dead", "timed_out")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsiteTask(Task):
    """Django's Task plus jobsite's per-task options; `@task(max_attempts=3, ...)` forwards them here."""

    max_attempts: int | None = None
    delivery: str = Delivery.AT_LEAST_ONCE.value
    hard_timeout: float = DEFAULT_HARD_TIMEOUT
    lease_timeout: float | None = None
    dedup_key: str | None = None
    dedup_window: float | None = None
    ordering_key: str | None = None
    group_key: str | None = None

    def using(
        self,
        *,
        dedup_key: str | None = None,
        dedup_window: float | None = None,
        ordering_key: str | None = None,
        group_key: str | None = None,
        **django_options: Any,
    ) -> "JobsiteTask":
        """Django's `using()` plus the per-enqueue keys: dedup_key (+ window), ordering_key and group_key (a
        tenant id: fair queues lease keys in turn, a group limit caps each key's items in flight)."""
        task = Task.using(self, **django_options)
        keys = {
            "dedup_key": dedup_key,
            "dedup_window": dedup_window,
            "ordering_key": ordering_key,
            "group_key": group_key,
        }
        changes = {k: v for k, v in keys.items() if v is not None}
        return replace(task, **changes) if changes else task

    def job_spec(self) -> JobSpec:
        """The worker's view of this task: a registry Task that calls the function with the stored arguments."""
        return JobSpec(
            name=self.module_path,
            func=run_django_task,
            queue=self.queue_name,
            delivery=Delivery(self.delivery),
            retry=Retry(times=self.max_attempts),
            hard_timeout=self.hard_timeout,
            lease_timeout=self.lease_timeout,
            dedup_window=self.dedup_window,
        )


def _task_result(task: Task, item: Any, reservations: list[Any], backend: str) -> TaskResult:
    payload = item.payload if isinstance(item.payload, dict) else {}
    errors = [
        TaskError(exception_class_path=exception_path(r), traceback=r.traceback or r.error)
        for r in reservations
        if r.outcome in FAILED_OUTCOMES or (r.outcome is None and r.error)
    ]
    result = TaskResult(
        task=task,
        id=str(item.id),
        status=STATUS[item.state],
        enqueued_at=item.created_at,
        started_at=reservations[0].reserved_at if reservations else None,
        finished_at=item.finished_at if item.state in ("done", "dead", "cancelled") else None,
        last_attempted_at=reservations[-1].reserved_at if reservations else None,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=backend,
        errors=errors,
        worker_ids=[r.worker_id for r in reservations],
    )
    if item.state == "done":
        object.__setattr__(result, "_return_value", item.result)
    return result


# "pkg.mod.Error: message" or "Error" (no message): the line Python prints for the exception itself.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
_TRACEBACK_HEAD = "Traceback (most recent call last):"


def exception_path(reservation: Any) -> str:
    """A failed attempt's exception class as an import path ("builtins.ValueError", "billing.errors.Declined").

    The worker stores `Name: message` as the error and the formatted traceback, whose exception line names
    the class with its module (Python leaves the module out for builtins). A chained traceback ends with the
    exception raised last; its line is the first unindented one after the last "Traceback" header (a message
    may run over several lines). An attempt stopped at its hard timeout is a TimeoutError.
    """
    if reservation.outcome == "timed_out":
        return "builtins.TimeoutError"
    lines = (reservation.traceback or "").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK_HEAD)]
    candidates = [line for line in lines[starts[-1] + 1 :] if line and not line[0].isspace()] if starts else []
    candidates.append((reservation.error or "").strip())
    match = _EXCEPTION_LINE.match(candidates[0])
    name = match.group(1) if match else "Exception"
    if "." in name:
        return name
    return f"builtins.{name}" if isinstance(getattr(builtins, name, None), type) else "builtins.Exception"


class QueueBackend(BaseTaskBackend):
    """Runs `django.tasks` tasks on jobsite's PostgreSQL queue. Touches no database until used."""

    task_class = JobsiteTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Django's own reading of QUEUES: left out, ["default"] (a task for another queue is refused at enqueue
        # with InvalidTask); an explicit empty list accepts any queue name.
        super().__init__(alias, params)
        self.using_db = self.options.get("DATABASE") or queue_db()

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not QUEUE_NAME.match(task.queue_name):
            raise InvalidTask(f"queue name must match {QUEUE_NAME.pattern}, not {task.queue_name!r}")
        if isinstance(task, JobsiteTask):
            try:
                Delivery(task.delivery)
            except ValueError:
                raise InvalidTask(
                    f"delivery must be one of {', '.join(d.value for d in Delivery)}, not {task.delivery!r}"
                ) from None
            if task.max_attempts is not None and (
                isinstance(task.max_attempts, bool) or not isinstance(task.max_attempts, int) or task.max_attempts < 1
            ):
                raise InvalidTask(f"max_attempts must be an integer >= 1, not {task.max_attempts!r}")
            if Delivery(task.delivery) is Delivery.AT_MOST_ONCE and task.max_attempts not in (None, 1):
                raise InvalidTask(
                    f"an at-most-once task is never retried: max_attempts={task.max_attempts} contradicts it"
                )
            try:
                _check_seconds("hard_timeout", task.hard_timeout)
                _check_seconds("lease_timeout", task.lease_timeout, allow_none=True)
                _check_seconds("dedup_window", task.dedup_window, allow_none=True)
            except (TypeError, ValueError) as exc:
                raise InvalidTask(str(exc)) from None
            if task.lease_timeout is not None and task.lease_timeout <= task.hard_timeout + LEASE_MARGIN:
                raise InvalidTask(
                    f"lease_timeout ({task.lease_timeout:g}s) must be longer than hard_timeout "
                    f"({task.hard_timeout:g}s) + {LEASE_MARGIN:g}s, or a lease could expire under a live handler"
                )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        try:
            payload = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        except RecursionError:  # normalize_json recurses: hostile nesting must be refused, not crash the caller
            raise engine.InvalidEnqueue(
                f"payload nested deeper than {queue_settings.MAX_PAYLOAD_DEPTH} levels"
            ) from None
        extra = as_jobsite_task(task)
        item = engine.enqueue(
            task.module_path,
            payload,
            queue=task.queue_name,
            priority=task.priority,
            run_at=task.run_after,
            lease_timeout=extra.lease_timeout,
            dedup_key=extra.dedup_key,
            dedup_window=extra.dedup_window,
            ordering_key=extra.ordering_key,
            group_key=extra.group_key,
            using=self.using_db,
        )
        result = TaskResult(
            task=task,
            id=str(item.id),
            status=TaskResultStatus.READY,
            enqueued_at=item.created_at,  # as stored: equal to what get_result() reads
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if item.duplicate:
            return self.get_result(result.id)
        # "Enqueued" means durable: announce it when the caller's transaction commits.
        on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=self.using_db, robust=True)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        from .models import ItemHistory, QueueItem, Reservation, ReservationHistory

        try:
            item_id = int(result_id)
        except (ValueError, TypeError):
            raise TaskResultDoesNotExist(result_id) from None
        # Hot first, then the history an archiver moved a finished item to (with its reservations).
        item = QueueItem.objects.using(self.using_db).filter(id=item_id).first()
        attempts = Reservation.objects if item is not None else ReservationHistory.objects
        if item is None:
            item = ItemHistory.objects.using(self.using_db).filter(id=item_id).first()
        if item is None:
            raise TaskResultDoesNotExist(result_id)
        task = resolve_task(item.task)
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id} is not a django.tasks task ({item.task})")
        reservations = list(attempts.using(self.using_db).filter(item_id=item.id).order_by("id"))
        return _task_result(task, item, reservations, self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []
        for name in sorted(self.queues):
            if not QUEUE_NAME.match(name):
                errors.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}]['QUEUES'] has an invalid queue name {name!r}",
                        hint=f"Queue names must match {QUEUE_NAME.pattern}.",
                        id="jobsite.E001",
                    )
                )
        unknown = set(self.options) - {"DATABASE"}
        if unknown:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys: {', '.join(sorted(unknown))}",
                    hint="QueueBackend accepts OPTIONS = {'DATABASE': '<alias>'}.",
                    id="jobsite.E002",
                )
            )
        if self.using_db not in connections.settings:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses database {self.using_db!r}, which is not in DATABASES",
                    id="jobsite.E003",
                )
            )
        elif connections.settings[self.using_db]["ENGINE"] not in (
            "django.db.backends.postgresql",
            "jobsite.embedded_backend",
        ):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] needs PostgreSQL; database {self.using_db!r} is "
                    f"{connections.settings[self.using_db]['ENGINE']}",
                    hint="jobsite's queue relies on SKIP LOCKED and LISTEN/NOTIFY.",
                    id="jobsite.E004",
                )
            )
        return errors


def resolve_task(name: str) -> Task | None:
    """The django.tasks Task stored under `name` (a module path), or None if it is not one of ours."""
    if "." not in name:
        return None
    try:
        task = import_string(name)
    except ImportError:
        return None
    if not isinstance(task, Task) or not isinstance(task.get_backend(), QueueBackend):
        return None
    return task


def job_spec_for(name: str) -> JobSpec | None:
    """The registry hook: a worker that meets an unregistered task name asks here."""
    task = resolve_task(name)
    if task is None:
        return None
    return as_jobsite_task(task).job_spec()


def as_jobsite_task(task: Task) -> JobsiteTask:
    """A plain django.tasks Task (built without the decorator) as a JobsiteTask with jobsite's default options."""
    if isinstance(task, JobsiteTask):
        return task
    return JobsiteTask(
        func=task.func,
        priority=task.priority,
        backend=task.backend,
        queue_name=task.queue_name,
        run_after=task.run_after,
        takes_context=task.takes_context,
    )


def run_django_task(payload: Any, ctx: Context) -> Any:
    """The handler behind every django.tasks item: call the function with its stored arguments, sending
    task_started and task_finished in the process that runs it, as Django's own backends do."""
    task = resolve_task(ctx.task)
    backend = task.get_backend()
    result = backend.get_result(str(ctx.item_id))
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    task_started.send(type(backend), task_result=result)
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = normalize_json(value)
    except BaseException as exc:
        kind = type(exc)
        error = TaskError(
            exception_class_path=f"{kind.__module__}.{kind.__qualname__}", traceback="".join(tb.format_exception(exc))
        )
        object.__setattr__(result, "errors", [*result.errors, error])
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", timezone.now())
        task_finished.send(type(backend), task_result=result)
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    object.__setattr__(result, "finished_at", timezone.now())
    task_finished.send(type(backend), task_result=result)
    return value
