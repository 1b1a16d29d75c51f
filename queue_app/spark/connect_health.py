"""The service functions that write and read a Spark Connect server's health row (SparkConnectServer).

Only the supervisor (connect_server.Supervisor) writes; the launcher reads `is_healthy` before sending a run there and
the admin shows the rows.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from .connect import ConnectUrl
from .models import SparkConnectServer

STALE_AFTER = timedelta(seconds=30)  # a supervisor probes every few seconds: older health is not believed


def _key(url: ConnectUrl) -> str:
    return f"{socket.gethostname()}:{url.port}"[:300]


def record(url: ConnectUrl, master: str, *, pid: int | None, healthy: bool, error: str = "") -> None:
    now = timezone.now()
    row, created = SparkConnectServer.objects.get_or_create(
        id=_key(url), defaults={"url": str(url), "host": socket.gethostname()[:255], "started_at": now}
    )
    if pid is not None and row.pid != pid:
        row.started_at = now
    row.url, row.master, row.pid, row.healthy = str(url), master[:200], pid, healthy
    row.last_error = error[:4000] if error else ("" if healthy else row.last_error)
    row.last_heartbeat = now
    row.save()


def restarted(url: ConnectUrl) -> None:
    SparkConnectServer.objects.filter(id=_key(url)).update(restarts=F("restarts") + 1)


def is_healthy(url: ConnectUrl) -> bool:
    """The server's supervisor saw it answer a query within STALE_AFTER."""
    return SparkConnectServer.objects.filter(
        id=_key(url), healthy=True, last_heartbeat__gte=timezone.now() - STALE_AFTER
    ).exists()
