"""Connection plumbing for the engine: Django's own connection, so engine calls join the caller's
`transaction.atomic()` and commit or roll back with it."""

from django.db import connections
from django.db.backends.utils import CursorWrapper


def cursor(using: str = "default") -> CursorWrapper:
    return connections[using].cursor()
