"""Moving models from one app label to another keeps their content types: the rows of `django_content_type` change
label and keep their ids, so the permissions granted on them (auth_permission rows point at the id) and the
admin's LogEntry rows stay attached. The layer apps' 0001 migrations call `relabel_migration(...)` for the models
that moved from `queue_app` to them (queue_app 0047: state only, the tables kept); their reverse relabels back.

Where a row of the new label already exists (post_migrate made it while the models were elsewhere), it is merged
into the kept one: its permissions are repointed to the kept row (a permission of the same codename there takes
its grants instead, and is deleted), whatever else points at it (LogEntry rows, any foreign key to the content
type) is repointed, and the row is deleted.

Raw SQL on the tables Django's contenttypes and auth apps make, found through the catalog, on the migration's
database, or where the router writes content types when that one does not hold them (a queue on a database of its
own); a project without those apps has nothing to relabel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

CONTENT_TYPES = "django_content_type"
PERMISSIONS = "auth_permission"


def _table_exists(cur: Any, table: str) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
    return cur.fetchone()[0]


def _references(cur: Any, table: str) -> list[tuple[str, str, str | None]]:
    """(table, column, other column or None) of every single-column foreign key pointing at `table`; the other
    column is the one a unique pair holds with it (a many-to-many table's other side: user_id of
    auth_user_user_permissions), where a repointed row could meet its twin."""
    cur.execute(
        """
        SELECT c.conrelid::regclass::text, a.attname,
               (SELECT a2.attname FROM pg_constraint u
                  JOIN pg_attribute a2 ON a2.attrelid = u.conrelid AND a2.attnum = ANY (u.conkey)
                 WHERE u.conrelid = c.conrelid AND u.contype = 'u' AND cardinality(u.conkey) = 2
                   AND a.attnum = ANY (u.conkey) AND a2.attnum <> a.attnum
                 ORDER BY u.conname LIMIT 1)
          FROM pg_constraint c
          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
         WHERE c.contype = 'f' AND c.confrelid = %s::regclass AND cardinality(c.conkey) = 1
         ORDER BY 1, 2
        """,
        [table],
    )
    return cur.fetchall()


def _repoint(cur: Any, references: list[tuple[str, str, str | None]], old: int, new: int, skip: str = "") -> None:
    """Rows pointing at `old` point at `new`; a many-to-many row that `new` already has is deleted instead."""
    for table, column, other in references:
        if table == skip:
            continue
        if other:
            cur.execute(
                f'DELETE FROM {table} t WHERE t."{column}" = %s AND EXISTS '
                f'(SELECT 1 FROM {table} k WHERE k."{column}" = %s AND k."{other}" = t."{other}")',
                [old, new],
            )
        cur.execute(f'UPDATE {table} SET "{column}" = %s WHERE "{column}" = %s', [new, old])


def _merge(cur: Any, duplicate: int, kept: int) -> None:
    """The content type `duplicate` (of the new label) is folded into `kept` and deleted."""
    if _table_exists(cur, PERMISSIONS):
        grants = _references(cur, PERMISSIONS)
        cur.execute(
            f"SELECT d.id, k.id FROM {PERMISSIONS} d LEFT JOIN {PERMISSIONS} k "
            "ON k.content_type_id = %s AND k.codename = d.codename WHERE d.content_type_id = %s",
            [kept, duplicate],
        )
        for permission, same in cur.fetchall():
            if same is None:
                cur.execute(f"UPDATE {PERMISSIONS} SET content_type_id = %s WHERE id = %s", [kept, permission])
            else:
                _repoint(cur, grants, permission, same)
                cur.execute(f"DELETE FROM {PERMISSIONS} WHERE id = %s", [permission])
    _repoint(cur, _references(cur, CONTENT_TYPES), duplicate, kept, skip=PERMISSIONS)
    cur.execute(f"DELETE FROM {CONTENT_TYPES} WHERE id = %s", [duplicate])


def relabel(connection: Any, old_label: str, new_label: str, models: Iterable[str]) -> int:
    """The content types of `models` (lower-case model names) under `old_label` take `new_label`, keeping their
    ids; returns how many changed label."""
    moved = 0
    with connection.cursor() as cur:
        if not _table_exists(cur, CONTENT_TYPES):
            return 0
        for model in models:
            cur.execute(
                f"SELECT app_label, id FROM {CONTENT_TYPES} WHERE model = %s AND app_label IN (%s, %s)",
                [model, old_label, new_label],
            )
            ids = dict(cur.fetchall())
            if old_label not in ids:
                continue
            if new_label in ids:
                _merge(cur, ids[new_label], ids[old_label])
            cur.execute(f"UPDATE {CONTENT_TYPES} SET app_label = %s WHERE id = %s", [new_label, ids[old_label]])
            moved += 1
    _clear_cache()
    return moved


def _clear_cache() -> None:
    from django.apps import apps

    if apps.is_installed("django.contrib.contenttypes"):
        from django.contrib.contenttypes.models import ContentType

        ContentType.objects.clear_cache()


def _content_types_connection(schema_editor: Any) -> Any:
    """Where the content types are: the migration's own database when it holds them, else the router's database
    for them (a queue on a database of its own migrates there; the content types stay on theirs)."""
    from django.apps import apps
    from django.db import connections, router

    connection = schema_editor.connection
    installed = apps.is_installed("django.contrib.contenttypes")
    if not installed or CONTENT_TYPES in connection.introspection.table_names():
        return connection
    from django.contrib.contenttypes.models import ContentType

    return connections[router.db_for_write(ContentType)]


def relabel_migration(old_label: str, new_label: str, models: Iterable[str]) -> tuple[Callable, Callable]:
    """(forward, backward) functions for a RunPython: relabel `models` from `old_label` to `new_label`, and back."""
    names = tuple(models)

    def forward(apps: Any, schema_editor: Any) -> None:
        relabel(_content_types_connection(schema_editor), old_label, new_label, names)

    def backward(apps: Any, schema_editor: Any) -> None:
        relabel(_content_types_connection(schema_editor), new_label, old_label, names)

    return forward, backward
