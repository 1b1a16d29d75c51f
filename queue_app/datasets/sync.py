"""Declarations -> rows: `sync_datasets()` writes every declared dataset's configuration to its Dataset row.

Run after `migrate` (a post_migrate receiver, apps.py: a deploy runs migrate, so the rows follow the code) and
by `dataset list`/`dataset show` before they read; record_materialization only makes sure the row exists (it must
not take a lock on the row in a producer's settle). One statement; a row whose snapshot is unchanged is not
rewritten. Rows of datasets no longer declared are kept: their materializations still name them.
"""

from __future__ import annotations

import json
from typing import Any

from ..engine.alias import connection, queue_db
from .declarations import declared_datasets
from .sql import SYNC


def sync_datasets() -> int:
    """Write the declared datasets' snapshots; returns how many rows were inserted or changed."""
    declared = declared_datasets()
    if not declared:
        return 0
    names = list(declared)
    with connection.cursor() as cursor:
        cursor.execute(
            SYNC,
            [names, [json.dumps(declared[n].config()) for n in names], [declared[n].declared_in for n in names]],
        )
        return cursor.rowcount


def sync_after_migrate(sender: Any = None, *, using: str | None = None, plan: Any = None, **kwargs: Any) -> None:
    """post_migrate receiver: sync once the datasets' table exists (not on a migration backwards past it)."""
    if using == queue_db() and "queue_app_dataset" in connection.introspection.table_names():
        sync_datasets()
