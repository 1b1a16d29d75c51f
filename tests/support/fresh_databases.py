"""Fresh databases on the test database's server, beside the test database, for the runs that need a database
set up as production sets it (the queue on a database of its own, a role that is not superuser): their URLs
for a child process, created and dropped as the server's superuser (the test's own connection parameters)."""

from urllib.parse import quote, urlencode

import psycopg
from django.db import connection


def server() -> dict[str, str]:
    """Where the test database's server is: host (a name or, for the embedded cluster, its socket directory),
    port and user, as Django connects."""
    params = connection.get_connection_params()
    return {
        "host": params.get("host") or "127.0.0.1",
        "port": str(params.get("port") or 5432),
        "user": params.get("user") or "postgres",
        "password": params.get("password") or "",
    }


def url(name: str, *, user: str | None = None, password: str | None = None) -> str:
    """A URL to database `name` on the test server, as the server's user or `user` (with `password`)."""
    where = server()
    who = quote(user or where["user"])
    secret = password if user else where["password"]
    auth = f"{who}:{quote(secret)}" if secret else who
    if where["host"].startswith("/"):  # a socket directory: libpq's host parameter
        return f"postgresql://{auth}@/{name}?{urlencode({'host': where['host'], 'port': where['port']})}"
    return f"postgres://{auth}@{where['host']}:{where['port']}/{name}"


def admin() -> psycopg.Connection:
    """An autocommit connection as the server's superuser, to the test database (CREATE/DROP DATABASE, roles)."""
    return psycopg.connect(url(connection.settings_dict["NAME"]), autocommit=True)


def create(name: str, *, owner: str | None = None) -> str:
    """Database `name`, new and empty (dropped first if a failed run left it); returns its URL as the server's
    user."""
    with admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' OWNER "{owner}"' if owner else ""))
    return url(name)


def drop(*names: str) -> None:
    with admin() as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def tables(db_url: str, like: str = "queue_app_%") -> set[str]:
    """The tables (partitions included) of database `db_url` whose names are LIKE `like`."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public' AND c.relname LIKE %s",
            [like],
        ).fetchall()
    return {name for (name,) in rows}
