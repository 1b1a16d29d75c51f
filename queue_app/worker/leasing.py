"""The settle-and-lease statement on a thread of its own, so that the supervisor's loop goes on while it runs.

The statement is the one round trip a worker makes per batch (engine.settle_and_lease: complete what finished,
reserve what comes next). Run in the loop's own thread it left the loop waiting on the server for its whole
duration: no outcome collected, no held item started, no hard timeout enforced, and the Python work of the next
round (building the leases, handing them to the pool, collecting outcomes) only after it. On its own thread the
loop does that work while the server runs the statement; the thread's wait on the socket releases the GIL.

One statement at a time (the supervisor sends the next only after taking this one's result), on this thread's
own database connection (supervisor.OTHER_CONNECTIONS counts it). A settle with no lease due comes here too (a
call asking for no items); while one runs, a notification may lease in the loop itself, beside it (the
supervisor's latency path: a slot idle, nothing held). Nothing changes in what is settled or leased,
only when the loop learns of it: a failed call hands its exception back to the loop, which keeps the outcomes it
sent and settles them again (settles are fenced), as it did when the statement ran in the loop itself.
"""

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections

from .. import engine, stages
from ..conf import queue_settings
from ..engine import Terms, tracing
from ..engine.alias import queue_connection

logger = logging.getLogger("jobsite.worker")


class LeaseCall:
    """One settle_and_lease call in flight at most, run by a thread started on the first `send`. `wake` is called
    (on that thread) when a result is there to `take`."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.busy = False  # sent and not taken yet
        self.sent: list = []  # the (lease, result) pairs the call in flight settles
        self.asked = 0  # items the call in flight asked for
        self._result: tuple[Any, BaseException | None] | None = None
        self.woken_at = self.sent_at = self.leased_at = 0.0  # the call's stage times (queue_app/stages.py), when on
        self.path = "thread"  # where the call in flight runs: "thread", or "loop" (`here`); for the stage times
        # The traced statement, whose leases carry the items' trace contexts and a workflow step's workflow id
        # and step name: with tracing on, and with JSON logs (a step's lines then name its workflow and step,
        # logcontext.py). Plain logs without tracing keep the plain statement (its plan, its columns).
        self.traced = tracing.enabled or queue_settings.LOG_FORMAT == "json"

    def send(
        self,
        done: list,
        queues: Sequence[str] | None,
        want: int,
        worker_id: str,
        terms: Terms | None,
        *,
        here: bool = False,
    ) -> None:
        """Start the call on the lease thread; or, `here`, run it in the caller's thread now (an idle worker has
        nothing to do meanwhile, and the hand-over to a thread and back would add to its items' start)."""
        if self.busy:
            raise RuntimeError("one settle_and_lease in flight at a time")
        self.busy, self.sent, self.asked, self._result = True, done, want, None
        if stages.on:
            self.sent_at, self.path = time.time(), "loop" if here else "thread"
        request = (done, queues, want, worker_id, terms, self.traced)
        if here:
            self._result = self._timed(request)
            return
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._serve, name="jobsite-lease", daemon=True)
            self.thread.start()
        self.requests.put(request)

    def take(self) -> tuple[Any, BaseException | None] | None:
        """(engine.SettledAndLeased, None) or (None, the exception it raised) once the call in flight ended;
        None while it runs or when nothing was sent."""
        result = self._result
        if not self.busy or result is None:
            return None
        self.busy, self._result = False, None
        return result

    def _serve(self) -> None:
        engine.engine_session_here()  # one of the worker's own threads (engine/db.py)
        while True:
            request = self.requests.get()
            if request is None:
                break
            self._result = self._timed(request)
            try:
                self.wake()
            except Exception:  # the loop polls at least every --poll-interval: it finds the result then
                logger.debug("could not wake the worker's loop after a lease", exc_info=True)
        connections.close_all()  # this thread's own connection

    def _timed(self, request: tuple) -> tuple[Any, BaseException | None]:
        result = self._call(request)
        if stages.on:
            self.leased_at = time.time()
        return result

    @staticmethod
    def _call(request: tuple) -> tuple[Any, BaseException | None]:
        done, queues, want, worker_id, terms, traced = request
        try:
            return engine.settle_and_lease(done, queues, want, worker_id, terms=terms, traced=traced), None
        except BaseException as exc:  # handed to the loop, which decides (database down: retry; else raise)
            # A connection that failed mid-statement may be unusable: the next call opens a new one.
            with contextlib.suppress(Exception):
                queue_connection().close()
            return None, exc

    def close(self, timeout: float = 5.0) -> None:
        """End the thread (after the call in flight, if any, returns) and its connection."""
        if self.thread is None:
            return
        self.requests.put(None)
        self.thread.join(timeout)
        self.thread = None
