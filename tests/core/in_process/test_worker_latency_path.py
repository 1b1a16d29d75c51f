"""The worker's latency path, run in process with the thread pool: a settle with no lease due runs on the lease
thread, and a notification arriving meanwhile leases at once beside it, rather than waiting behind its round
trip (issue 47)."""

import signal
import threading

import psycopg
import pytest
from django.db import connection, connections

from queue_app.models import ExecutionLog, ItemState, QueueItem
from queue_app.probes.tasks import close_log_connection
from queue_app.registry import get_task
from queue_app.worker import Supervisor, WorkerOptions
from tests.support.waiting import seen_waiting, wait_for
from tests.tasks import worker_tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_probe_log_connection():
    yield
    close_log_connection()


def _started(item_id: int) -> bool:
    return ExecutionLog.objects.filter(item_id=item_id).exists()


def test_a_notification_leases_at_once_while_the_previous_items_settle_is_held_up():
    worker_tasks.GATE.clear()
    first = get_task("tests.gated").enqueue({}).id  # its handler waits for the gate
    # No poll would lease the second item in time: only its notification can.
    supervisor = Supervisor(WorkerOptions(pool="thread", concurrency=2, poll_interval=30))
    seen: dict[str, bool] = {}

    def race() -> None:
        try:
            wait_for(
                lambda: supervisor.running and QueueItem.objects.get(id=first).state == ItemState.RESERVED,
                30,
                what="the first item to run",
                interval=0.02,
            )
            params = connection.get_connection_params()
            with psycopg.connect(**params, autocommit=True) as holder, holder.transaction():
                # The first item's row locked while its handler still runs, then the handler let go: its
                # settle waits on the lock.
                holder.execute("SELECT 1 FROM queue_app_queueitem WHERE id = %s FOR UPDATE", (first,))
                worker_tasks.GATE.set()
                seen_waiting(what="the first item's settle blocked on its row")
                second = get_task("queue_app.probe").enqueue({}).id
                try:
                    wait_for(lambda: _started(second), 10, what="the second item to start", interval=0.02)
                    seen["second_started_while_settle_held"] = True
                except AssertionError:
                    seen["second_started_while_settle_held"] = False
                seen["first_still_reserved"] = (
                    QueueItem.objects.get(id=first).state == ItemState.RESERVED  # its settle had not gone
                )
        finally:
            worker_tasks.GATE.set()
            connections.close_all()
            supervisor._on_signal(signal.SIGTERM, None)  # what SIGTERM does, without signalling this process

    helper = threading.Thread(target=race)
    helper.start()
    assert supervisor.run() == 0
    helper.join()

    assert seen == {"second_started_while_settle_held": True, "first_still_reserved": True}
    assert set(QueueItem.objects.values_list("state", flat=True)) == {ItemState.DONE}
    assert supervisor.stats.stale == 0
