"""Which binaries run the cluster: the ``pgserver`` wheel (preferred) or the machine's PostgreSQL (fallback), and
how each starts it. A data dir is only ever started by binaries of its own major version."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from .paths import PG_USER, START_TIMEOUT, log_file, log_tail
from .tools import is_root, major_of, owner_name, run_pg_tool


class EmbeddedPostgresUnavailable(ImproperlyConfigured):
    """No PostgreSQL binaries can run the embedded cluster."""


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
        if is_root():  # pgserver runs the server as its `pgserver` user, which must reach the data dir
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            _ensure_traversable(pgdata.parent)
        # cleanup_mode=None: the server outlives this process and is reused by the next one.
        pgserver.get_server(pgdata, cleanup_mode=None)


class _SystemEngine(_Engine):
    name = "system PostgreSQL"

    def _os_user(self, pgdata: Path) -> str | None:
        if not is_root():
            return None
        owner = owner_name(pgdata) if pgdata.exists() else None
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
                    str(log_file(pgdata)),
                    "-o",
                    f"-h '' -k {shlex.quote(str(socket_dir))}",
                    "start",
                ],
                as_user=os_user,
                timeout=START_TIMEOUT + 10,
            )
        except subprocess.CalledProcessError as exc:
            raise ImproperlyConfigured(
                f"Could not start the embedded PostgreSQL in {pgdata}:\n{exc.output}\n{log_tail(pgdata)}"
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
    return _PgserverEngine(Path(POSTGRES_BIN_PATH), major_of(Path(POSTGRES_BIN_PATH)))


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


def available_engines() -> list[_Engine]:
    engines: list[_Engine] = []
    pgserver = _pgserver_engine()
    if pgserver is not None:
        engines.append(pgserver)
    engines.extend(_SystemEngine(path, major_of(path)) for path in _system_bindirs())
    return engines


def server_bindirs() -> list[Path]:
    """Every directory of PostgreSQL server binaries (initdb, pg_ctl, postgres) this machine has, in the order the
    embedded cluster prefers them: the pgserver wheel's first, then the system's, highest major version first."""
    return [engine.bindir for engine in available_engines()]


def _no_postgres_error(detail: str = "") -> EmbeddedPostgresUnavailable:
    return EmbeddedPostgresUnavailable(
        "jobsite needs PostgreSQL and none can be started here. Either set DATABASE_URL "
        "(e.g. postgres://user@host:5432/jobsite), or install the `pgserver` package (PostgreSQL in a wheel; "
        "Python 3.12: `pip install pgserver`), or install PostgreSQL server binaries (initdb/pg_ctl, "
        "e.g. `apt install postgresql`)." + (f"\n{detail}" if detail else "")
    )


def choose_engine(pgdata: Path) -> _Engine:
    engines = available_engines()
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


def bindir_for(pgdata: Path) -> Path | None:
    """The binaries of the data dir's major version (to stop it, or for its psql), else the first found."""
    try:
        data_major = (pgdata / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        data_major = None
    engines = available_engines()
    for engine in engines:
        if engine.major == data_major:
            return engine.bindir
    return engines[0].bindir if engines else None
