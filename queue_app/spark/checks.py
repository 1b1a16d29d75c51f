"""System checks of Spark jobs. jobsite.W010: Spark runs need a Java runtime. A warning, not an error: the queue,
the worker and the admin work without Java; only launching a Spark run fails (with the same hint). jobsite.E113:
a job in code or settings names datasets (produces, consumes, on_update) and no installed app reads them (the
datasets app registers on queue_app/dataset_refs.py's `problems`)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .. import dataset_refs
from .java import INSTALL_HINT, JavaNotFound, check_java
from .registry import code_jobs


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


@checks.register("jobsite")
def datasets_unread(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return dataset_refs.unread(
        (f"Spark job {job.name!r}", bool(job.produces or job.consumes or job.on_update)) for job in code_jobs()
    )
