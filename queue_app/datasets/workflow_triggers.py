"""Registered workflows as consumers of data-aware triggers (datasets/triggers.py): a workflow declared with
`on_update=` is started for a partition (services.start, its partition parameter set from the key: one per
dimension for "day|region", as for a Spark job: triggers.declared_consumer) inside the transaction that records
its last upstream materialization. Registered as a consumer source when Django is ready (datasets/apps.py)."""

from __future__ import annotations

from collections.abc import Iterator

from ..workflows import services
from ..workflows.definition import registered_workflows
from . import triggers


def start_workflow(name: str, params: dict[str, str], requested_by: str) -> str:
    """One workflow `name` with `params`, started in the caller's transaction."""
    return f"workflow:{services.start(name, params, started_by=f'update of {requested_by}'[:150]).id}"


def workflow_consumers() -> Iterator[triggers.Consumer]:
    """A consumer per registered workflow declared with on_update."""
    for definition in registered_workflows():
        if definition.on_update is None:
            continue
        yield triggers.declared_consumer(
            "workflow",
            definition.name,
            definition.on_update,
            start_workflow,
            params=[p.name for p in definition.params],
            origin=f"workflow {definition.name!r}",
        )


triggers.add_source(workflow_consumers)
