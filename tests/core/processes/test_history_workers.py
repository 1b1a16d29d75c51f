"""Partitioned history under real workers: their maintenance archives what they finish while they run, and a
day of history dropped by retention (DROP TABLE of its partitions) in the middle of it loses nothing else."""

import signal

import pytest
from django.db import connection, transaction

from queue_app.engine import history
from queue_app.models import ExecutionLog, ItemHistory, QueueItem, ReservationHistory
from queue_app.registry import get_task
from tests.support.history_helpers import age, archive_all, finished
from tests.support.waiting import wait_for
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks the workers --import)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # real workers

PROBES = 3000


def archived(ids: list[int]) -> int:
    return ItemHistory.objects.filter(id__in=ids).count()


def test_retention_drops_a_day_while_workers_run_and_archive(worker):
    ids = get_task("queue_app.probe").enqueue_many([{}] * PROBES)
    workers = [
        worker(f"w{n}", "--queues", "default", "--concurrency", "4", env={"JOBSITE_ARCHIVE_AFTER": "0"})
        for n in range(3)
    ]
    wait_for(lambda: archived(ids) > 0, 120, what="the workers' archiver to move finished probes")
    # A day ten days old, written while the workers lease, settle and archive.
    with transaction.atomic():  # never seen finished today: a worker's archiver may move them too
        old = finished(20, "old")
        age(old, "10 days")

    def old_day_moved() -> bool:
        # Archived by this test or a worker; and a worker's retention may drop the day as soon as it is there (its
        # first turn comes within seconds of its start): a CI run saw the partition dropped before the first look.
        archive_all()
        return not QueueItem.objects.filter(id__in=old).exists() and archived(old) in (0, 20)

    wait_for(old_day_moved, 60, what="the old day out of the hot table, archived (and maybe dropped already)")

    history.drop_expired_partitions()  # the default retention: 7 days

    assert archived(old) == 0 and not ReservationHistory.objects.filter(item_id__in=old).exists()
    wait_for(lambda: archived(ids) == PROBES, 300, what="every probe done and archived")
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(60) == 0, proc.log.read_text()
    # Nothing lost or run twice across the move: each probe ran once, is done, and is in exactly one place.
    runs = ExecutionLog.objects.filter(item_id__in=ids).values_list("item_id", flat=True)
    assert sorted(runs) == sorted(ids)
    assert set(ItemHistory.objects.filter(id__in=ids).values_list("state", flat=True)) == {"done"}
    assert not QueueItem.objects.filter(id__in=ids).exists()
    assert ReservationHistory.objects.filter(item_id__in=ids).count() == PROBES
    with connection.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT id) FROM queue_app_item_all WHERE id = ANY(%s)", [ids])
        assert cur.fetchone() == (PROBES, PROBES)
    assert "Traceback" not in "".join(proc.log.read_text() for proc in workers)


def test_a_queue_keeping_seconds_keeps_seconds_of_history_while_workers_run(worker):
    """The only queue keeps 2 s: the workers' maintenance archives its finished probes and then deletes them row
    by row (its day would keep them up to a day): every probe ran exactly once and none is left anywhere."""
    from datetime import timedelta

    from queue_app import engine, services

    engine.ensure_queue("default")
    services.set_queue_options("default", retention=timedelta(seconds=2))
    ids = get_task("queue_app.probe").enqueue_many([{}] * PROBES)
    workers = [
        worker(f"w{n}", "--queues", "default", "--concurrency", "4", env={"JOBSITE_ARCHIVE_AFTER": "0"})
        for n in range(3)
    ]
    wait_for(lambda: ExecutionLog.objects.filter(item_id__in=ids).count() == PROBES, 300, what="every probe run")

    def gone() -> bool:
        return not QueueItem.objects.filter(id__in=ids).exists() and archived(ids) == 0

    wait_for(gone, 120, what="every probe archived and then pruned by the workers' history_retention unit")
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(60) == 0, proc.log.read_text()
    assert sorted(ExecutionLog.objects.filter(item_id__in=ids).values_list("item_id", flat=True)) == sorted(ids)
    assert not ReservationHistory.objects.filter(item_id__in=ids).exists()
    assert "Traceback" not in "".join(proc.log.read_text() for proc in workers)
