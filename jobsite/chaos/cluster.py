"""A private PostgreSQL cluster owned by one chaos run, so the run may restart it.

Never the shared server: other people's tests run on it. The binaries are the `pgserver` wheel's (PostgreSQL 16)
or the machine's (`/usr/lib/postgresql/*/bin`, `pg_ctl` on PATH), as jobsite/embedded_pg/ finds them
(server_bindirs). As root, the server runs as the `postgres` OS user, else the `pgserver` one (PostgreSQL refuses
root; embedded_pg.server_os_user).
"""

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from jobsite.embedded_pg import run_pg_tool, server_bindirs, server_os_user

DB_USER = "postgres"


def find_bindir() -> Path:
    """initdb + pg_ctl: the pgserver wheel's first, then the machine's, newest major first."""
    bindirs = server_bindirs()
    if not bindirs:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl): install pgserver or postgresql")
    return bindirs[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """initdb + pg_ctl on a temporary data dir, listening on 127.0.0.1:<port> (and a socket in the dir)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="jobsite-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "log"
        self.bindir = find_bindir()
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        self.os_user = server_os_user() if self.as_root else None
        if self.as_root and self.os_user is None:
            raise RuntimeError("running as root with no `postgres` or `pgserver` OS user to run PostgreSQL as")
        self.restarts: list[float] = []  # seconds each restart took

    # -- running PostgreSQL's tools -------------------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> str:
        """Run a PostgreSQL tool (as `os_user` when we are root), as the embedded database does."""
        try:
            return run_pg_tool([str(self.bindir / args[0]), *args[1:]], as_user=self.os_user, timeout=timeout)
        except subprocess.CalledProcessError as exc:
            failed = f"{' '.join(args)} failed ({exc.returncode})"
            raise RuntimeError(f"{failed}:\n{exc.output}\n{self.log_tail()}") from None

    def _pg_ctl(self, *args: str, timeout: float = 120) -> str:
        return self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", *args, timeout=timeout)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- life cycle -----------------------------------------------------------------------------------------

    def start(self, dbname: str) -> None:
        """Create the cluster, start it and create `dbname`."""
        if self.as_root:
            entry = pwd.getpwnam(self.os_user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chmod(self.root, 0o700)
            for parent in self.root.parents:  # the postgres user must reach the data dir
                if not parent.stat().st_mode & 0o001:
                    parent.chmod(parent.stat().st_mode | 0o001)
        self._run("initdb", "-D", str(self.data), "-U", DB_USER, "-A", "trust", "-E", "UTF8", "--no-sync")
        # fsync off: this run tests the queue, not the disk; a restart is a clean one (-m fast).
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300 "
            "-c shared_buffers=128MB"
        )
        self._pg_ctl("-o", options, "start")
        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')

    def restart(self) -> float:
        """Stop the server (fast: every session is terminated) and start it again with the same options.
        Returns the seconds it took."""
        started = time.monotonic()
        self._pg_ctl("-m", "fast", "restart")
        took = time.monotonic() - started
        self.restarts.append(took)
        return took

    def stop(self, *, remove: bool = True) -> None:
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):  # not running
            self._pg_ctl("-m", "fast", "stop", timeout=60)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def conninfo(self, dbname: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{dbname}"
