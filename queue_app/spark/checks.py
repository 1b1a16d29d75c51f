"""System check jobsite.W010: Spark runs need a Java runtime. A warning, not an error: the queue, the worker and
the admin work without Java; only launching a Spark run fails (with the same hint)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .java import INSTALL_HINT, JavaNotFound, check_java


@checks.register("jobsite")
def java_runtime(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        check_java()
    except JavaNotFound as exc:
        return [
            checks.Warning(
                f"Spark runs cannot start: {str(exc).replace(INSTALL_HINT, '').strip()}",
                hint=INSTALL_HINT,
                id="jobsite.W010",
            )
        ]
    return []
