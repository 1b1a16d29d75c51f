"""The django-q2 peer's no-op task, and `enqueue(n)`, which queues n of them with `async_task` (django-q2 has no
bulk enqueue: one OrmQ row per call, all in one transaction). Imported only under the peer's own settings."""

from django.db import transaction
from django_q.tasks import async_task


def noop() -> None:
    return None


def enqueue(n: int) -> None:
    with transaction.atomic():
        for _ in range(n):
            async_task(noop)
