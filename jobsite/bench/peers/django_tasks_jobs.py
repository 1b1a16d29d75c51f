"""The django-tasks-db peer's no-op task, and `enqueue(n)`, which queues n of them (django.tasks has no bulk
enqueue: one `enqueue()` per job, all in one transaction), and the latency's probe. Imported only under the peer's
own settings."""

from django.db import transaction
from django.tasks import task

from .probe import record_start


@task()
def noop() -> None:
    return None


@task()
def probe(n: int) -> None:
    record_start(n)


def enqueue_probe(n: int) -> None:
    probe.enqueue(n)


def enqueue(n: int) -> None:
    with transaction.atomic():
        for _ in range(n):
            noop.enqueue()
