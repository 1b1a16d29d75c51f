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

The package, one module per job: ``paths`` (where the cluster lives, its log, the start/stop lock),
``postmaster`` (reading the running server's state), ``tools`` (running PostgreSQL's programs, as another OS
user when root), ``engines`` (which binaries, and how each starts the cluster) and ``lifecycle`` (the API
below).
"""

from .engines import EmbeddedPostgresUnavailable, server_bindirs
from .lifecycle import ensure_database, ensure_running, psql_executable, started_here, status, stop, uri
from .paths import pgdata_dir, var_dir
from .tools import run_pg_tool, server_os_user

__all__ = [
    "EmbeddedPostgresUnavailable",
    "ensure_database",
    "ensure_running",
    "pgdata_dir",
    "psql_executable",
    "run_pg_tool",
    "server_bindirs",
    "server_os_user",
    "started_here",
    "status",
    "stop",
    "uri",
    "var_dir",
]
