"""The database alias the queue lives on (JOBSITE["DATABASE"], "default" unless set): the one place the engine,
the worker, the admin, the commands and the layers find their connection and their transaction.

`connection` is Django's connection to that alias (a proxy, as `django.db.connection` is to "default"), `atomic()`
and `on_commit()` are Django's on it, `queue_db(using)` is the alias a call with an optional `using=` works on.
The models reach the alias through the router (queue_app.routers.JobsiteRouter), which a project whose queue is
not on "default" installs (jobsite.E143 when it does not).

An enqueue joins the transaction open on the queue's alias, never one on another: `cross_database_guard()`
refuses an enqueue made inside an atomic block on another alias while none is open on the queue's, since the
item would commit at once, apart from the caller's writes (a rollback of those would leave an item for work
that never happened). On another database, enqueue after commit: `transaction.on_commit(lambda: enqueue(...))`.
"""

from collections.abc import Callable
from typing import Any

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from ..conf import queue_settings
from .errors import CrossDatabaseEnqueue

ROUTER = "queue_app.routers.JobsiteRouter"


def queue_db(using: str | None = None) -> str:
    """`using` when given, else the queue's alias (JOBSITE["DATABASE"])."""
    return using or queue_settings.DATABASE or DEFAULT_DB_ALIAS


class _QueueConnection:
    """Django's connection to the queue's alias, looked up at each use (the setting may change under a test)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(connections[queue_db()], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(connections[queue_db()], name, value)

    def __eq__(self, other: object) -> bool:
        return connections[queue_db()] == other

    __hash__ = object.__hash__


connection = _QueueConnection()


def queue_connection(using: str | None = None) -> Any:
    """Django's connection wrapper for `using`, else for the queue's alias."""
    return connections[queue_db(using)]


class _Atomic(transaction.Atomic):
    """Django's Atomic whose alias is looked up when it is entered, so it may decorate a function at import."""

    @property
    def using(self) -> str:
        return queue_db(self._using)

    @using.setter
    def using(self, value: str | None) -> None:
        self._using = value


def atomic(using: Any = None, savepoint: bool = True, durable: bool = False) -> Any:
    """transaction.atomic() on the queue's alias (or `using`); `@atomic` and `@atomic()` decorate as Django's."""
    if callable(using):
        return _Atomic(None, savepoint, durable)(using)
    return _Atomic(using, savepoint, durable)


def on_commit(func: Callable[[], Any], using: str | None = None, robust: bool = False) -> None:
    """transaction.on_commit() on the queue's alias (or `using`)."""
    transaction.on_commit(func, using=queue_db(using), robust=robust)


def cross_database_guard(using: str | None = None) -> None:
    """Raise CrossDatabaseEnqueue when the caller is inside an atomic block on another alias but not on the
    queue's: the enqueue could not be part of that transaction. Only connections already open are looked at
    (a dict walk: nothing on the wire)."""
    alias = queue_db(using)
    if len(connections.settings) < 2:
        return
    mine = connections[alias]
    if mine.in_atomic_block:
        return
    for other in connections.all(initialized_only=True):
        if other.alias != alias and other.in_atomic_block:
            raise CrossDatabaseEnqueue(
                f"enqueue on database {alias!r} inside a transaction on {other.alias!r}: the item would commit at"
                f" once, apart from that transaction's writes. Enqueue after it commits"
                f" (transaction.on_commit(lambda: enqueue(...), using={other.alias!r})), or keep the application's"
                f" tables on the queue's database; nothing was written"
            )


@checks.register("jobsite")
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobsite.E142: JOBSITE["DATABASE"] names no alias of DATABASES; jobsite.E143: the queue is not on
    "default" and the router is not in DATABASE_ROUTERS (the models would read and write "default")."""
    from django.conf import settings

    alias = queue_db()
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f'JOBSITE["DATABASE"] is {alias!r}, which is not in DATABASES ({", ".join(settings.DATABASES)}).',
                id="jobsite.E142",
            )
        ]
    routers = [r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__qualname__}" for r in
               settings.DATABASE_ROUTERS]  # fmt: skip
    if alias != DEFAULT_DB_ALIAS and ROUTER not in routers:
        return [
            checks.Error(
                f'JOBSITE["DATABASE"] is {alias!r} but {ROUTER} is not in DATABASE_ROUTERS: jobsite\'s models would'
                f' read, write and migrate on "default".',
                hint=f'DATABASE_ROUTERS = ["{ROUTER}", ...] (before any router that claims every app).',
                id="jobsite.E143",
            )
        ]
    return []
