"""What the tests of real worker processes share: a worker's output and exit, the runs per item, the items still open or
held by a worker, short leases; and an in-process supervisor's burst run (run_worker)."""

import subprocess
from collections import Counter

from django.db.models import Count

from queue_app import engine, services
from queue_app.models import ExecutionLog, ItemState, QueueItem, Reservation
from queue_app.worker import Supervisor, WorkerOptions
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks the workers --import)  # noqa: F401  (registers the tests.* tasks)


def output(proc: subprocess.Popen) -> str:
    return proc.log.read_text()


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"worker did not exit within {timeout}s; its output:\n{output(proc)[-3000:]}") from None


def runs_per_item() -> Counter:
    return Counter(dict(ExecutionLog.objects.values_list("item_id").annotate(n=Count("id"))))


def open_items() -> int:
    return QueueItem.objects.filter(state__in=[ItemState.READY, ItemState.RESERVED]).count()


def held_by(worker_id: str) -> set[int]:
    """Items whose attempt by `worker_id` never ended: in flight in it when it died."""
    return set(Reservation.objects.filter(worker_id=worker_id, outcome__isnull=True).values_list("item_id", flat=True))


def short_leases(queue: str = "default") -> None:
    """Leases as short as the tasks allow (their hard timeout + margin), so a killed worker's items come back
    within seconds."""
    engine.ensure_queue(queue)
    services.set_queue_options(queue, lease_timeout=1.0)


def run_worker(**options) -> Supervisor:
    settings = {"pool": "thread", "concurrency": 2, "burst": True, "poll_interval": 0.1, **options}
    supervisor = Supervisor(WorkerOptions(**settings))
    assert supervisor.run() == 0
    return supervisor
