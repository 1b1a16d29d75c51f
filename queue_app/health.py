"""/healthz: 200 when the database answers, every migration is applied and a worker is live; else 503 with what
failed. Imported by the URLconf only (the migration loader is not part of a project's start)."""

from typing import Any

from django.db import DatabaseError
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .engine.alias import connection
from .monitoring import live_workers

_migrations_applied = False  # once true in this process it stays true: migrations are not unapplied live


def migrations_applied() -> bool:
    global _migrations_applied
    if not _migrations_applied:
        executor = MigrationExecutor(connection)
        _migrations_applied = not executor.migration_plan(executor.loader.graph.leaf_nodes())
    return _migrations_applied


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database answers, every migration is applied and at least one worker is live; else 503
    with what failed."""
    checks: dict[str, Any] = {"database": False, "migrations": False, "live_workers": 0}
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        checks["database"] = True
        checks["migrations"] = migrations_applied()
        checks["live_workers"] = len(live_workers())
    except DatabaseError as exc:
        checks["error"] = str(exc).strip()
    healthy = checks["database"] and checks["migrations"] and checks["live_workers"] > 0
    return JsonResponse({"status": "ok" if healthy else "fail", **checks}, status=200 if healthy else 503)
