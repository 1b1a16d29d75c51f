"""Where the embedded cluster lives (``<VAR_DIR>/pgdata``), its log, and the lock that serialises starting and
stopping it across processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
PG_USER = "postgres"  # the database superuser (not the OS user)
START_TIMEOUT = 60  # seconds


def var_dir() -> Path:
    """``JOBSITE_VAR_DIR``, else ``settings.VAR_DIR`` (if settings are configured), else ``<project>/var``."""
    env = os.environ.get("JOBSITE_VAR_DIR")
    if env:
        return Path(env).expanduser().resolve()
    try:
        from django.conf import settings

        if settings.configured and getattr(settings, "VAR_DIR", None):
            return Path(settings.VAR_DIR).expanduser().resolve()
    except ImproperlyConfigured:  # pragma: no cover - settings module missing/broken
        pass
    return BASE_DIR / "var"


def pgdata_dir() -> Path:
    return var_dir() / "pgdata"


def log_file(pgdata: Path) -> Path:
    return pgdata / "log"  # the same name pgserver uses


def log_tail(pgdata: Path, lines: int = 20) -> str:
    try:
        text = log_file(pgdata).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "Server log (last lines):\n" + "\n".join(text[-lines:])


@contextlib.contextmanager
def lock():
    """Exclusive inter-process lock around check-and-start / stop (an ``fcntl`` lock on a file in VAR_DIR)."""
    vdir = var_dir()
    vdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(vdir / "embedded_pg.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
