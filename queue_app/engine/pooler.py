"""The connection pooler setting (JOBSITE["CONNECTION_POOLER"]) and the LISTEN connection's URL
(JOBSITE["LISTEN_DATABASE_URL"]): what a transaction pooler in front of the database changes, in one place.

Behind a pooler that pools by transaction (PgBouncer's pool_mode = transaction), a server connection serves
another client after each transaction, so nothing of jobsite's may outlive one: the engine prepares no
statement (engine/db.py), sets no session setting, holds no session advisory lock (duties that span
transactions are leader rows: engine/leaders.py), and LISTENs only on a connection past the pooler.
"""

from typing import Any

import psycopg
from django.core import checks

from ..conf import queue_settings
from .alias import queue_connection

MODES = (None, "", "transaction")  # "": the environment variable set empty


def pooled() -> bool:
    """Whether a transaction pooler sits between jobsite and the database (a cheap test: the setting's value)."""
    return queue_settings.CONNECTION_POOLER == "transaction"


def listen_url() -> str | None:
    """The URL the worker's LISTEN connection is opened from, past the pooler; None: Django's parameters."""
    return queue_settings.LISTEN_DATABASE_URL or None


def wakeup_mode() -> str:
    """How a worker learns of new items: "listen" (LISTEN/NOTIFY, polling as the fallback) or "poll" (behind a
    transaction pooler without LISTEN_DATABASE_URL: a LISTEN there would land on a pooled server connection and
    its notifications be dropped)."""
    return "poll" if pooled() and listen_url() is None else "listen"


def port_differs(using: str | None = None) -> tuple[int, int] | None:
    """(the port connected to, the port the server listens on) when they differ: a pooler or a proxy likely sits
    in between (PgBouncer on 6432 in front of 5432). None when they agree or it cannot be told (a Unix socket)."""

    wrapper = queue_connection(using)
    with wrapper.cursor() as cur:
        cur.execute("SELECT inet_server_port()")
        server = cur.fetchone()[0]
    connected = wrapper.settings_dict.get("PORT") or 5432
    if server is None or int(connected) == int(server):
        return None
    return int(connected), int(server)


def listen_connection(params: dict[str, Any]) -> psycopg.Connection:
    """A new autocommit connection for LISTEN: from LISTEN_DATABASE_URL when set, else from `params` (Django's)."""
    url = listen_url()
    if url is None:
        return psycopg.connect(**params, autocommit=True)
    return psycopg.connect(url, autocommit=True, prepare_threshold=None)


@checks.register("jobsite")
def check_pooler(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobsite.E140: a CONNECTION_POOLER the engine does not know; jobsite.E141: a LISTEN_DATABASE_URL psycopg
    cannot parse."""
    found = []
    if queue_settings.CONNECTION_POOLER not in MODES:
        found.append(
            checks.Error(
                f"CONNECTION_POOLER must be None or 'transaction', not {queue_settings.CONNECTION_POOLER!r}",
                id="jobsite.E140",
            )
        )
    url = listen_url()
    if url is not None:
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            found.append(checks.Error(f"LISTEN_DATABASE_URL: {exc}", id="jobsite.E141"))
    return found
