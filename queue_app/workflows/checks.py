"""System check jobsite.E201: a registered workflow's conditions are sound (workflows/definition.py,
WorkflowConditionError: a branch naming a step that is not directly downstream of it, an unknown run_if rule).

Each workflow whose parameters all have defaults is built with them (building writes nothing). Only condition
errors are reported: a build that fails otherwise (a file a Spark step's parameters name is missing here, the
database is not migrated yet) says nothing about its conditions, and fails at start with its own message.

jobsite.E113: a workflow declared with `on_update=` (datasets) while no installed app reads them (the datasets
app registers on queue_app/dataset_refs.py's `problems`)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .. import dataset_refs
from .definition import WorkflowConditionError, registered_workflows


@checks.register("jobsite")
def workflow_conditions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors = []
    for definition in registered_workflows():
        try:
            definition.graph(definition.validate({}))
        except WorkflowConditionError as exc:
            errors.append(
                checks.Error(
                    f"workflow {definition.name!r}: {exc}",
                    hint="A branch names its direct downstream steps (those with after=[the branch]).",
                    obj=definition.name,
                    id="jobsite.E201",
                )
            )
        except Exception:  # noqa: BLE001, S112  not a condition error: reported when it starts
            continue
    return errors


@checks.register("jobsite")
def datasets_unread(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return dataset_refs.unread((f"workflow {w.name!r}", bool(w.on_update)) for w in registered_workflows())
