"""A collector that hangs (issue 49, gap 7): it accepts the worker's export and never answers. A real worker with
tracing on towards it (a 16-span export queue, a 300 s export timeout) drains every item while that export is
still unanswered, and counts the spans it had to drop: no item waits for the collector. (The collector that
refuses, stopped mid-run: tests/core/processes/test_tracing.py.)"""

import socket
import threading
from types import SimpleNamespace

import pytest

from queue_app import engine
from queue_app.models import QueueItem, Worker
from tests.support.tracing_fixtures import otel_env
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class HangingCollector:
    """Accepts connections on loopback, reads what comes, answers nothing until `release()` closes them all."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.received = threading.Event()  # the first export request arrived (and is held)
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.open:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                self.received.set()
        except OSError:
            pass

    def still_holding(self) -> bool:
        """Every accepted connection still open on the worker's side (none gave up on its export)."""
        alive = 0
        for conn in self.held:
            try:
                conn.setblocking(False)
                alive += conn.recv(1, socket.MSG_PEEK) != b""  # b"": the worker closed it
            except BlockingIOError:
                alive += 1  # nothing to read and not closed: still waiting for our answer
            except OSError:
                pass
            finally:
                conn.setblocking(True)
        return bool(self.held) and alive == len(self.held)

    def release(self) -> None:
        self.open = False
        self.server.close()
        for conn in self.held:
            conn.close()


def test_a_collector_that_never_answers_holds_no_item_and_the_drops_are_counted(worker):
    collector = HangingCollector()
    ids = engine.enqueue_many("queue_app.sleep", [{"seconds": 0.01}] * 200, queue="otel_hang")
    env = otel_env(
        SimpleNamespace(url=collector.url),
        OTEL_BSP_MAX_QUEUE_SIZE="16",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="8",
        OTEL_EXPORTER_OTLP_TIMEOUT="300",
    )
    proc = worker("otel-hang", "--queues", "otel_hang", "--concurrency", "4", env=env)
    try:
        assert collector.received.wait(60), "the worker never exported"
        done = QueueItem.objects.filter(id__in=ids, state="done")
        wait_for(lambda: done.count() == len(ids), 120, what="every item done while the collector hangs")
        assert collector.still_holding()  # the export that began first is still unanswered: nothing waited for it
        dropped = wait_for(
            lambda: (Worker.objects.get(id="otel-hang").stats or {}).get("spans_dropped", 0),
            60,
            what="the dropped spans counted on the worker's row",
        )
        assert dropped > 0
    finally:
        proc.kill()  # not its exit under test: a graceful one would retry the export up to its 300 s timeout
        proc.wait(60)
        collector.release()
