"""The running server's state, read cheaply: ``postmaster.pid``, a signal 0 and a stat of the socket (no
subprocess), and waiting for it to be ready."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from .paths import PG_USER


@dataclass(frozen=True)
class PostmasterInfo:
    pid: int
    port: int
    socket_dir: str
    status: str  # "starting", "ready", "stopping", ... ("" while postgres is still writing the file)


def read_postmaster_pid(pgdata: Path) -> PostmasterInfo | None:
    """Parse ``postmaster.pid`` (pid, datadir, start time, port, socket dir, listen addr, shmem, status)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as exc:
        raise ImproperlyConfigured(
            f"Cannot read {pgdata / 'postmaster.pid'} ({exc}); run as the user that owns {pgdata}."
        ) from exc
    try:
        pid = int(lines[0])
        port = int(lines[3]) if len(lines) > 3 and lines[3].strip() else 5432
    except (IndexError, ValueError):
        return None
    socket_dir = lines[4].strip() if len(lines) > 4 else ""
    state = lines[7].strip() if len(lines) > 7 else ""
    return PostmasterInfo(pid=pid, port=port, socket_dir=socket_dir, status=state)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_postgres_process(pid: int) -> bool:
    """True if ``pid`` runs and (where /proc tells) is a postgres process, guarding against pid reuse."""
    if not pid_alive(pid):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return sys.platform != "linux"  # no /proc (macOS): trust the signal check
    except OSError:
        return True
    return comm.startswith("postgres")


def socket_path(info: PostmasterInfo) -> Path:
    return Path(info.socket_dir) / f".s.PGSQL.{info.port}"


def ready_info(pgdata: Path) -> PostmasterInfo | None:
    """The server's info if it is up and accepting connections on its socket, else None."""
    info = read_postmaster_pid(pgdata)
    if info is None or info.status != "ready" or not info.socket_dir:
        return None
    if not is_postgres_process(info.pid):
        return None
    try:
        if not stat.S_ISSOCK(os.stat(socket_path(info)).st_mode):
            return None
    except OSError:
        return None
    return info


def connection_params(info: PostmasterInfo) -> dict:
    return {"host": info.socket_dir, "port": info.port, "user": PG_USER}


def clear_stale_pidfile(pgdata: Path) -> None:
    """Remove a postmaster.pid whose pid now belongs to another process (after a crash or reboot)."""
    info = read_postmaster_pid(pgdata)
    if info is not None and pid_alive(info.pid) and not is_postgres_process(info.pid):
        with contextlib.suppress(FileNotFoundError):
            (pgdata / "postmaster.pid").unlink()


def wait_ready(pgdata: Path, timeout: float, *, only_if_starting: bool = False) -> PostmasterInfo | None:
    """Wait up to ``timeout`` s for the server to be ready; None if it is not.

    With ``only_if_starting``, return None at once when no live postmaster is there (nothing to wait for), and
    otherwise wait for one that is starting (or stopping) outside our lock to settle.
    """
    deadline = time.monotonic() + timeout
    while True:
        info = ready_info(pgdata)
        if info is not None:
            return info
        if only_if_starting:
            pid_info = read_postmaster_pid(pgdata)
            if pid_info is None or not is_postgres_process(pid_info.pid):
                return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
