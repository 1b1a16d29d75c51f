"""The django-tasks-db peer's no-op task, and `enqueue(n)`, which queues n of them (django.tasks has no bulk
enqueue: one `enqueue()` per job, all in one transaction). Imported only under the peer's own settings."""

from django.db import transaction
from django.tasks import task


@task()
def noop() -> None:
    return None


def enqueue(n: int) -> None:
    with transaction.atomic():
        for _ in range(n):
            noop.enqueue()
