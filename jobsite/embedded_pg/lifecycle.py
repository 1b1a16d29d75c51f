"""The embedded cluster's life cycle, the API the rest of the project uses: start it on demand (and create a
database), stop it, describe it, and reach it (a libpq URI, psql)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from .engines import bindir_for, choose_engine
from .paths import START_TIMEOUT, lock, log_file, log_tail, pgdata_dir
from .postmaster import (
    clear_stale_pidfile,
    connection_params,
    is_postgres_process,
    pid_alive,
    read_postmaster_pid,
    ready_info,
    wait_ready,
)
from .tools import is_root, owner_name, run_pg_tool

_started_here = False  # this process started the cluster (it was not running, nor being started by another)


def started_here() -> bool:
    """True when this process started the embedded cluster: ``up`` stops on exit only what it started."""
    return _started_here


def ensure_running() -> dict:
    """Start the embedded cluster if needed; return ``{"host": <socket dir>, "port": ..., "user": ...}``."""
    global _started_here
    pgdata = pgdata_dir()
    info = ready_info(pgdata)
    if info is not None:  # fast path: already running
        return connection_params(info)
    with lock():
        info = ready_info(pgdata)
        if info is not None:  # another process started it while we waited for the lock
            return connection_params(info)
        clear_stale_pidfile(pgdata)
        info = wait_ready(pgdata, START_TIMEOUT, only_if_starting=True)
        if info is None:
            engine = choose_engine(pgdata)
            info = _start(engine, pgdata)
            _started_here = info is not None
        if info is None:
            raise ImproperlyConfigured(f"The embedded PostgreSQL in {pgdata} did not become ready.\n{log_tail(pgdata)}")
        return connection_params(info)


def _start(engine, pgdata: Path):
    """Start the cluster with `engine` and wait for it to be ready (None if it never is). pgserver gives pg_ctl
    10 s: on a loaded machine the server is often still starting when that runs out (pgserver then fails reading a
    log not written yet), so a failed start waits for a postmaster that is coming up, and is tried once more when
    none is there."""
    for attempt in (1, 2):
        try:
            engine.start(pgdata)
        except ImproperlyConfigured:
            raise
        except Exception as exc:
            info = wait_ready(pgdata, START_TIMEOUT, only_if_starting=True)
            if info is not None:
                return info
            if attempt == 2:
                raise ImproperlyConfigured(
                    f"Could not start the embedded PostgreSQL ({engine!r}) in {pgdata}: {exc}\n{log_tail(pgdata)}"
                ) from exc
            continue
        return wait_ready(pgdata, START_TIMEOUT)
    return None


def ensure_database(name: str, params: dict | None = None) -> bool:
    """Create database ``name`` on the embedded server if it is missing. True if it was created."""
    import psycopg
    from psycopg import errors, sql

    params = params or ensure_running()
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        for attempt in range(10):
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                return True
            except (errors.DuplicateDatabase, errors.UniqueViolation):
                return False  # created concurrently by another process
            except errors.ObjectInUse:  # template1 busy with a concurrent CREATE DATABASE
                if attempt == 9:
                    raise
                time.sleep(0.1 * (attempt + 1))
    return False  # pragma: no cover


def stop(timeout: float = START_TIMEOUT) -> bool:
    """Stop the embedded cluster (``pg_ctl -m fast stop``). True if a running server was stopped."""
    pgdata = pgdata_dir()
    with lock():
        info = read_postmaster_pid(pgdata)
        if info is None or not is_postgres_process(info.pid):
            return False
        bindir = bindir_for(pgdata)
        os_user = owner_name(pgdata) if is_root() else None
        if os_user == "root":
            os_user = None
        if bindir is not None:
            try:
                run_pg_tool(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(pgdata),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        str(int(timeout)),
                        "stop",
                    ],
                    as_user=os_user,
                    timeout=timeout + 10,
                )
                return True
            except subprocess.CalledProcessError:
                if not pid_alive(info.pid):
                    return True
                # fall through to signalling the postmaster directly
        os.kill(info.pid, signal.SIGINT)  # SIGINT = "fast" shutdown
        deadline = time.monotonic() + timeout
        while pid_alive(info.pid):
            if time.monotonic() > deadline:
                raise ImproperlyConfigured(f"The embedded PostgreSQL (pid {info.pid}) did not stop in {timeout}s.")
            time.sleep(0.05)
        return True


def status() -> dict:
    """Describe the embedded cluster without starting it."""
    pgdata = pgdata_dir()
    try:
        version = (pgdata / "PG_VERSION").read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        version = None
    except PermissionError:
        version = "?"
    info = read_postmaster_pid(pgdata)
    alive = info is not None and is_postgres_process(info.pid)
    ready = ready_info(pgdata)
    result: dict = {
        "pgdata": str(pgdata),
        "initialized": version is not None,
        "pg_version": version,
        "running": ready is not None,
        "pid": info.pid if alive else None,
        "state": (info.status or "starting") if alive else "stopped",
        "log": str(log_file(pgdata)),
    }
    if ready is not None:
        result.update(connection_params(ready))
    return result


def uri(dbname: str = "postgres", params: dict | None = None) -> str:
    """A libpq URI for ``dbname`` on the embedded server (starts it if needed)."""
    from urllib.parse import quote

    params = params or ensure_running()
    return (
        f"postgresql://{quote(params['user'])}@/{quote(dbname)}"
        f"?host={quote(str(params['host']), safe='/')}&port={params['port']}"
    )


def psql_executable() -> str | None:
    """psql from the binaries that run the cluster (pgserver or system), else the first one on PATH."""
    bindir = bindir_for(pgdata_dir())
    if bindir is not None and (bindir / "psql").is_file():
        return str(bindir / "psql")
    return shutil.which("psql")
