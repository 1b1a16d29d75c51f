"""OpenLineage emission (issue 38): run events sent through the `openlineage-python` client, never in a run's way.

Off unless the OPENLINEAGE setting names a transport:

    JOBSITE = {"OPENLINEAGE": {
        "transport": {"type": "http", "url": "http://marquez:5000", "endpoint": "api/v1/lineage", "timeout": 5},
        # or {"type": "file", "log_file_path": "/var/log/jobsite/lineage.jsonl", "append": True}, {"type": "console"}
        "namespace": "jobsite",          # the jobs' namespace (and the workflows', the parent runs')
        "dataset_namespace": "jobsite",  # the datasets'
        "queue_size": 1000,              # events waiting to be sent in one process, at most
    }}

`emit_on_commit(event)` hands an event to this process's sender thread when the caller's transaction commits
(transaction.on_commit: a run that rolls back sends nothing, and nothing is sent while a row lock is held). The
thread sends one event at a time through the client (an HTTP transport with a timeout, a retry or two); a send
that fails, or an event that finds the queue full, is dropped with a log line and counted in the shared
OpenLineageCounter row "events_dropped" (/metrics: jobsite_openlineage_events_dropped_total). Nothing here
raises into the caller: a transport that is down never blocks or fails a run. At exit the thread gets a couple
of seconds to send what waits.

The system check jobsite.E131 reports a setting the client cannot use.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.core import checks
from django.db import DatabaseError, connections

from ..conf import queue_settings
from ..engine.alias import connection, on_commit
from .models import OpenLineageCounter

logger = logging.getLogger(__name__)

TRANSPORTS = ("http", "file", "console")
KEYS = {"transport", "namespace", "dataset_namespace", "queue_size"}
PRODUCER = "https://github.com/jobsite/jobsite/tree/main/queue_app"
HTTP_DEFAULTS = {
    "timeout": 5.0,
    # The client's default is 5 retries with backoff (about 5 s of a dead receiver per event): two, quickly.
    "retry": {
        "total": 2,
        "read": 2,
        "connect": 2,
        "backoff_factor": 0.2,
        "status_forcelist": [500, 502, 503, 504],
        "allowed_methods": ["HEAD", "POST"],
    },
}
EXIT_FLUSH_SECONDS = 2.0
DROPPED = "events_dropped"
COUNT_DROP = """
INSERT INTO queue_app_openlineagecounter (name, value, last_error, updated_at) VALUES (%s, 1, %s, now())
ON CONFLICT (name) DO UPDATE SET value = queue_app_openlineagecounter.value + 1, last_error = EXCLUDED.last_error,
    updated_at = EXCLUDED.updated_at
"""


class OpenLineageConfigError(ValueError):
    pass


def config() -> dict[str, Any] | None:
    """The OPENLINEAGE setting checked: None when off; OpenLineageConfigError saying what is wrong."""
    raw = queue_settings.OPENLINEAGE
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise OpenLineageConfigError("OPENLINEAGE is None (off) or a mapping with a transport")
    if unknown := set(raw) - KEYS:
        raise OpenLineageConfigError(f"OPENLINEAGE: unknown keys {sorted(map(str, unknown))} (known: {sorted(KEYS)})")
    transport = raw.get("transport")
    if not isinstance(transport, Mapping) or transport.get("type") not in TRANSPORTS:
        raise OpenLineageConfigError(f"OPENLINEAGE['transport'] is a mapping whose type is one of {TRANSPORTS}")
    for key in ("namespace", "dataset_namespace"):
        value = raw.get(key, "jobsite")
        if not isinstance(value, str) or not value or len(value) > 200:
            raise OpenLineageConfigError(f"OPENLINEAGE[{key!r}] is a non-empty string")
    size = raw.get("queue_size", 1000)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1_000_000:
        raise OpenLineageConfigError("OPENLINEAGE['queue_size'] is a whole number from 1 to 1,000,000")
    transport = dict(transport)
    if transport["type"] == "http":
        transport = {**copy.deepcopy(HTTP_DEFAULTS), **transport}
    return {
        "transport": transport,
        "namespace": raw.get("namespace", "jobsite"),
        "dataset_namespace": raw.get("dataset_namespace", "jobsite"),
        "queue_size": size,
    }


def _client(transport: dict[str, Any]) -> Any:
    from openlineage.client import OpenLineageClient  # the client is imported only when lineage is on

    return OpenLineageClient(config={"transport": transport})


@checks.register("jobsite")
def check_openlineage(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobsite.E131: an OPENLINEAGE setting the client cannot use."""
    try:
        found = config()
        if found is not None:
            _client(found["transport"])
    except Exception as exc:  # noqa: BLE001  the client raises several kinds for a bad transport
        return [checks.Error(f"OPENLINEAGE: {exc}", id="jobsite.E131")]
    return []


def enabled() -> bool:
    """Whether events are sent (a cheap test: the setting's value; a bad setting counts as off)."""
    return queue_settings.OPENLINEAGE is not None


def run_id(kind: str, pk: int) -> str:
    """A stable UUID for a run of `kind` ("spark_run", "workflow"), the same at every event of that run."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"jobsite:{kind}:{pk}"))


# -- the sender ---------------------------------------------------------------------------------------------


class _Sender:
    """This process's queue and thread (made again after a fork: a forked child has no thread)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.pid = os.getpid()
        self.settings = settings
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=settings["queue_size"])
        self.client = _client(settings["transport"])
        self.thread = threading.Thread(target=self._run, name="openlineage-sender", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            event = self.queue.get()
            try:
                self.client.emit(event)
            except Exception as exc:  # noqa: BLE001  any failure of the transport drops the event, nothing more
                _dropped(event, exc)
            finally:
                self.queue.task_done()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued event was sent or dropped, at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.queue.all_tasks_done:
            while self.queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.queue.all_tasks_done.wait(left)
        return True


_sender: list[_Sender | None] = [None]
_lock = threading.Lock()


def _current() -> _Sender | None:
    try:
        settings = config()
    except OpenLineageConfigError as exc:
        logger.warning("OpenLineage is off: %s", exc)
        return None
    if settings is None:
        return None
    sender = _sender[0]
    if sender is None or sender.pid != os.getpid() or sender.settings != settings:
        with _lock:
            sender = _sender[0]
            if sender is None or sender.pid != os.getpid() or sender.settings != settings:
                try:
                    sender = _sender[0] = _Sender(settings)
                except Exception as exc:  # noqa: BLE001  a transport the client cannot build: off, said once
                    logger.warning("OpenLineage is off: its transport cannot be built: %s", exc)
                    return None
    return sender


def _submit(event: Any) -> None:
    sender = _current()
    if sender is None:
        return
    try:
        sender.queue.put_nowait(event)
    except queue.Full:
        _dropped(event, "the OpenLineage queue is full")


def emit_on_commit(event: Any) -> None:
    """Send `event` once the current transaction commits (at once outside one); never raises."""
    if event is not None and enabled():
        on_commit(lambda: _submit(event))


def flush(timeout: float = 5.0) -> bool:
    """Wait for this process's queued events to be sent or dropped (tests, and the exit hook)."""
    sender = _sender[0]
    return sender is None or sender.pid != os.getpid() or sender.flush(timeout)


def dropped_count() -> int:
    row = OpenLineageCounter.objects.filter(name=DROPPED).values_list("value", flat=True).first()
    return row or 0


def _dropped(event: Any, why: Any) -> None:
    what = f"{getattr(event, 'eventType', '?')} {getattr(getattr(event, 'job', None), 'name', '?')}"
    logger.warning("OpenLineage event dropped (%s): %s", what, why)
    in_sender = threading.current_thread().name == "openlineage-sender"
    try:
        with connection.cursor() as cursor:
            cursor.execute(COUNT_DROP, [DROPPED, str(why)[:1000]])
    except DatabaseError as exc:
        logger.warning("OpenLineage: the dropped event could not be counted: %s", exc)
    finally:
        if in_sender:
            connections.close_all()  # the sender thread's own connection: not held between drops


@atexit.register
def _at_exit() -> None:
    flush(EXIT_FLUSH_SECONDS)
