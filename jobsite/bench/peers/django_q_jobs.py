"""The django-q2 peer's no-op task, and `enqueue(n)`, which queues n of them with `async_task` (django-q2 has no
bulk enqueue: one OrmQ row per call, all in one transaction), and the latency's probe. Imported only under the
peer's own settings."""

from django.db import transaction
from django_q.tasks import async_task

from .probe import record_start


def noop() -> None:
    return None


def probe(n: int) -> None:
    record_start(n)


def enqueue_probe(n: int) -> None:
    async_task(probe, n)


def enqueue(n: int) -> None:
    with transaction.atomic():
        for _ in range(n):
            async_task(noop)
