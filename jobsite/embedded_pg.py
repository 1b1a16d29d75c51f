"""The project's private, embedded PostgreSQL cluster.

Used when ``DATABASE_URL`` is unset (see jobsite/settings.py and jobsite/embedded_backend). The cluster lives
in ``<VAR_DIR>/pgdata`` (``VAR_DIR``: env ``JOBSITE_VAR_DIR``, else settings.VAR_DIR, else ``<project>/var``),
is started on demand, reused while it runs, and listens only on a unix socket (``-h ''``: no TCP port at all).

Where the binaries come from, in order:

1. the ``pgserver`` wheel (PostgreSQL 16; cp312 wheels only). As root it runs the server as the ``pgserver``
   system user, which it creates.
2. PostgreSQL server binaries on the machine (``pg_ctl``/``initdb`` on PATH or ``/usr/lib/postgresql/*/bin``).
   As root they run as the owner of an existing data dir, else as the ``postgres`` OS user.

An existing data dir is only ever started by binaries of its own major version (``PG_VERSION``).

Cost: when the server already runs, ``ensure_running()`` reads ``postmaster.pid`` and stats the socket; no
subprocess, no import of pgserver. Starting (and the check before it) happens under an ``fcntl`` lock in
``VAR_DIR``, so concurrent processes start one server.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
PG_USER = "postgres"  # the database superuser (not the OS user)
START_TIMEOUT = 60  # seconds

__all__ = [
    "EmbeddedPostgresUnavailable",
    "ensure_database",
    "ensure_running",
    "pgdata_dir",
    "psql_executable",
    "status",
    "stop",
    "uri",
    "var_dir",
]


class EmbeddedPostgresUnavailable(ImproperlyConfigured):
    """No PostgreSQL binaries can run the embedded cluster."""


# ------------------------------------------------------------------------------------------------------------
# Locations


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


def _log_file(pgdata: Path) -> Path:
    return pgdata / "log"  # the same name pgserver uses


# ------------------------------------------------------------------------------------------------------------
# Reading the running server's state (cheap: files and a signal 0, no subprocess)


@dataclass(frozen=True)
class _PostmasterInfo:
    pid: int
    port: int
    socket_dir: str
    status: str  # "starting", "ready", "stopping", ... ("" while postgres is still writing the file)


def _read_postmaster_pid(pgdata: Path) -> _PostmasterInfo | None:
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
    return _PostmasterInfo(pid=pid, port=port, socket_dir=socket_dir, status=state)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_postgres_process(pid: int) -> bool:
    """True if ``pid`` runs and (where /proc tells) is a postgres process, guarding against pid reuse."""
    if not _pid_alive(pid):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return sys.platform != "linux"  # no /proc (macOS): trust the signal check
    except OSError:
        return True
    return comm.startswith("postgres")


def _socket_path(info: _PostmasterInfo) -> Path:
    return Path(info.socket_dir) / f".s.PGSQL.{info.port}"


def _ready_info(pgdata: Path) -> _PostmasterInfo | None:
    """The server's info if it is up and accepting connections on its socket, else None."""
    info = _read_postmaster_pid(pgdata)
    if info is None or info.status != "ready" or not info.socket_dir:
        return None
    if not _is_postgres_process(info.pid):
        return None
    try:
        if not stat.S_ISSOCK(os.stat(_socket_path(info)).st_mode):
            return None
    except OSError:
        return None
    return info


def _params(info: _PostmasterInfo) -> dict:
    return {"host": info.socket_dir, "port": info.port, "user": PG_USER}


# ------------------------------------------------------------------------------------------------------------
# Locking


@contextlib.contextmanager
def _lock():
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


# ------------------------------------------------------------------------------------------------------------
# Running commands (as the server's OS user when we are root)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _owner_name(path: Path) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (KeyError, FileNotFoundError):
        return None


def run_pg_tool(cmd: list[str], *, as_user: str | None = None, timeout: float | None = None) -> str:
    """Run a PostgreSQL command, optionally as another OS user (we are root then).

    Output goes to temporary files, not pipes: the postmaster that ``pg_ctl start`` leaves behind must not
    hold a pipe of ours open.
    """
    kwargs: dict = {}
    if as_user is not None and _is_root():
        import pwd

        entry = pwd.getpwnam(as_user)
        kwargs.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd="/",
            timeout=timeout,
            **kwargs,
        )
        out.seek(0)
        output = out.read()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, output=output)
    return output


def _major_of(bindir: Path) -> str | None:
    try:
        out = subprocess.run(
            [str(bindir / "pg_ctl"), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    return match.group(1) if match else None


# ------------------------------------------------------------------------------------------------------------
# Engines: pgserver (preferred) and system binaries (fallback)


class _Engine:
    name = ""

    def __init__(self, bindir: Path, major: str | None):
        self.bindir = bindir
        self.major = major

    def start(self, pgdata: Path) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name} (PostgreSQL {self.major or '?'} in {self.bindir})"


class _PgserverEngine(_Engine):
    name = "pgserver"

    def start(self, pgdata: Path) -> None:
        pgserver = _import_pgserver()
        # pgserver logs every command at INFO; keep that out of the project's logs unless asked for.
        pg_logger = logging.getLogger("pgserver")
        if pg_logger.level == logging.NOTSET:
            pg_logger.setLevel(logging.WARNING)
        # pgserver caches one handle per data dir and process; drop it so a server stopped since is restarted.
        pgserver.PostgresServer._instances.pop(pgdata.resolve(), None)
        # cleanup_mode=None: the server outlives this process and is reused by the next one.
        pgserver.get_server(pgdata, cleanup_mode=None)


class _SystemEngine(_Engine):
    name = "system PostgreSQL"

    def _os_user(self, pgdata: Path) -> str | None:
        if not _is_root():
            return None
        owner = _owner_name(pgdata) if pgdata.exists() else None
        if owner and owner != "root":
            return owner
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise EmbeddedPostgresUnavailable(
                "PostgreSQL refuses to run as root and there is no `postgres` OS user to run the embedded "
                "cluster as. Set DATABASE_URL, or install pgserver (Python 3.12), or create a `postgres` "
                "user."
            ) from None
        return "postgres"

    def start(self, pgdata: Path) -> None:
        os_user = self._os_user(pgdata)
        pgdata.mkdir(mode=0o700, exist_ok=True)
        if os_user is not None:
            import pwd

            entry = pwd.getpwnam(os_user)
            _ensure_traversable(pgdata.parent)
            if pgdata.stat().st_uid != entry.pw_uid:
                for path in [pgdata, *pgdata.rglob("*")]:
                    os.lchown(path, entry.pw_uid, entry.pw_gid)
        if not (pgdata / "PG_VERSION").exists():
            run_pg_tool(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(pgdata),
                    "-U",
                    PG_USER,
                    "--auth=trust",
                    "--auth-local=trust",
                    "--encoding=UTF8",
                ],
                as_user=os_user,
                timeout=300,
            )
        socket_dir = _socket_dir_for(pgdata, os_user)
        try:
            run_pg_tool(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(pgdata),
                    "-w",
                    "-t",
                    str(START_TIMEOUT),
                    "-l",
                    str(_log_file(pgdata)),
                    "-o",
                    f"-h '' -k {shlex.quote(str(socket_dir))}",
                    "start",
                ],
                as_user=os_user,
                timeout=START_TIMEOUT + 10,
            )
        except subprocess.CalledProcessError as exc:
            raise ImproperlyConfigured(
                f"Could not start the embedded PostgreSQL in {pgdata}:\n{exc.output}\n{_log_tail(pgdata)}"
            ) from exc


def _ensure_traversable(path: Path) -> None:
    """As root, let the server's OS user reach the data dir: add o+x to ancestors that lack it."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _socket_dir_for(pgdata: Path, os_user: str | None) -> Path:
    """The data dir itself if the socket path fits (sun_path is ~104-108 bytes), else a private temp dir."""
    if len(str(pgdata / ".s.PGSQL.65535").encode()) < 100:
        return pgdata
    digest = hashlib.sha256(str(pgdata).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"jobsite-pg-{digest}"
    path.mkdir(mode=0o700, exist_ok=True)
    if os_user is not None:
        import pwd

        entry = pwd.getpwnam(os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _import_pgserver():
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (pgserver keeps a lock file there; /tmp is fine).
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


def _pgserver_engine() -> _Engine | None:
    try:
        _import_pgserver()
        from pgserver._commands import POSTGRES_BIN_PATH
    except Exception:  # not installed (e.g. Python 3.13), or broken
        return None
    return _PgserverEngine(Path(POSTGRES_BIN_PATH), _major_of(Path(POSTGRES_BIN_PATH)))


def _system_bindirs() -> list[Path]:
    """Directories with system PostgreSQL server binaries, highest major version first."""
    found: list[Path] = []
    for name in ("pg_ctl", "initdb"):
        exe = shutil.which(name)
        if exe:
            found.append(Path(os.path.realpath(exe)).parent)
    for root in ("/usr/lib/postgresql", "/usr/local/pgsql", "/opt/homebrew/opt", "/usr/local/opt"):
        base = Path(root)
        if base.is_dir():
            candidates = [base / "bin", *sorted(base.glob("*/bin"), key=_version_key, reverse=True)]
            found.extend(candidates)
    result: list[Path] = []
    for path in found:
        if (path / "pg_ctl").is_file() and (path / "initdb").is_file() and path not in result:
            result.append(path)
    return result


def _version_key(path: Path) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", str(path.parent.name)) or [0])


def _engines() -> list[_Engine]:
    engines: list[_Engine] = []
    pgserver = _pgserver_engine()
    if pgserver is not None:
        engines.append(pgserver)
    engines.extend(_SystemEngine(path, _major_of(path)) for path in _system_bindirs())
    return engines


def _no_postgres_error(detail: str = "") -> EmbeddedPostgresUnavailable:
    return EmbeddedPostgresUnavailable(
        "jobsite needs PostgreSQL and none can be started here. Either set DATABASE_URL "
        "(e.g. postgres://user@host:5432/jobsite), or install the `pgserver` package (PostgreSQL in a wheel; "
        "Python 3.12: `pip install pgserver`), or install PostgreSQL server binaries (initdb/pg_ctl, "
        "e.g. `apt install postgresql`)." + (f"\n{detail}" if detail else "")
    )


def _choose_engine(pgdata: Path) -> _Engine:
    engines = _engines()
    if not engines:
        raise _no_postgres_error()
    try:
        data_major = (pgdata / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        return engines[0]
    for engine in engines:
        if engine.major == data_major:
            return engine
    have = ", ".join(repr(e) for e in engines)
    raise EmbeddedPostgresUnavailable(
        f"{pgdata} holds a PostgreSQL {data_major} cluster but only these binaries are available: {have}. "
        f"Install PostgreSQL {data_major} (or pgserver, which ships 16), or set DATABASE_URL, or, to start "
        f"over and LOSE the embedded data, stop the old server and remove {pgdata}."
    )


def _log_tail(pgdata: Path, lines: int = 20) -> str:
    try:
        text = _log_file(pgdata).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "Server log (last lines):\n" + "\n".join(text[-lines:])


# ------------------------------------------------------------------------------------------------------------
# Public API


def ensure_running() -> dict:
    """Start the embedded cluster if needed; return ``{"host": <socket dir>, "port": ..., "user": ...}``."""
    pgdata = pgdata_dir()
    info = _ready_info(pgdata)
    if info is not None:  # fast path: already running
        return _params(info)
    with _lock():
        info = _ready_info(pgdata)
        if info is not None:  # another process started it while we waited for the lock
            return _params(info)
        _clear_stale_pidfile(pgdata)
        info = _wait_ready(pgdata, START_TIMEOUT, only_if_starting=True)
        if info is None:
            engine = _choose_engine(pgdata)
            try:
                engine.start(pgdata)
            except ImproperlyConfigured:
                raise
            except Exception as exc:
                raise ImproperlyConfigured(
                    f"Could not start the embedded PostgreSQL ({engine!r}) in {pgdata}: {exc}\n{_log_tail(pgdata)}"
                ) from exc
            info = _wait_ready(pgdata, START_TIMEOUT)
        if info is None:
            raise ImproperlyConfigured(
                f"The embedded PostgreSQL in {pgdata} did not become ready.\n{_log_tail(pgdata)}"
            )
        return _params(info)


def _clear_stale_pidfile(pgdata: Path) -> None:
    """Remove a postmaster.pid whose pid now belongs to another process (after a crash or reboot)."""
    info = _read_postmaster_pid(pgdata)
    if info is not None and _pid_alive(info.pid) and not _is_postgres_process(info.pid):
        with contextlib.suppress(FileNotFoundError):
            (pgdata / "postmaster.pid").unlink()


def _wait_ready(pgdata: Path, timeout: float, *, only_if_starting: bool = False) -> _PostmasterInfo | None:
    """Wait up to ``timeout`` s for the server to be ready; None if it is not.

    With ``only_if_starting``, return None at once when no live postmaster is there (nothing to wait for), and
    otherwise wait for one that is starting (or stopping) outside our lock to settle.
    """
    deadline = time.monotonic() + timeout
    while True:
        info = _ready_info(pgdata)
        if info is not None:
            return info
        if only_if_starting:
            pid_info = _read_postmaster_pid(pgdata)
            if pid_info is None or not _is_postgres_process(pid_info.pid):
                return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


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


def _stop_engine_bindir(pgdata: Path) -> Path | None:
    try:
        data_major = (pgdata / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        data_major = None
    engines = _engines()
    for engine in engines:
        if engine.major == data_major:
            return engine.bindir
    return engines[0].bindir if engines else None


def stop(timeout: float = START_TIMEOUT) -> bool:
    """Stop the embedded cluster (``pg_ctl -m fast stop``). True if a running server was stopped."""
    pgdata = pgdata_dir()
    with _lock():
        info = _read_postmaster_pid(pgdata)
        if info is None or not _is_postgres_process(info.pid):
            return False
        bindir = _stop_engine_bindir(pgdata)
        os_user = _owner_name(pgdata) if _is_root() else None
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
                if not _pid_alive(info.pid):
                    return True
                # fall through to signalling the postmaster directly
        os.kill(info.pid, signal.SIGINT)  # SIGINT = "fast" shutdown
        deadline = time.monotonic() + timeout
        while _pid_alive(info.pid):
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
    info = _read_postmaster_pid(pgdata)
    alive = info is not None and _is_postgres_process(info.pid)
    ready = _ready_info(pgdata)
    result: dict = {
        "pgdata": str(pgdata),
        "initialized": version is not None,
        "pg_version": version,
        "running": ready is not None,
        "pid": info.pid if alive else None,
        "state": (info.status or "starting") if alive else "stopped",
        "log": str(_log_file(pgdata)),
    }
    if ready is not None:
        result.update(_params(ready))
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
    bindir = _stop_engine_bindir(pgdata_dir())
    if bindir is not None and (bindir / "psql").is_file():
        return str(bindir / "psql")
    return shutil.which("psql")
