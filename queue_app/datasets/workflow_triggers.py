"""Registered workflows as consumers of data-aware triggers (datasets/triggers.py): a workflow declared with
`on_update=` is started for a partition (services.start, its partition parameter set from the key: one per
dimension for "day|region", as for a Spark job: triggers.declared_consumer) inside the transaction that records
its last upstream materialization. Registered as a consumer source when Django is ready (datasets/apps.py).

A dynamic key (dynamic.py) and such workflows: any start of one (a trigger's, the CLI's, the admin's, code's)
checks its partition parameter against the upstreams' partitioning in the start's transaction (check_start, on
workflows/hooks.start_checks), reading the key's row FOR SHARE; the key's removal is refused while a
workflow of it is open (open_workflows).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..workflows import services
from ..workflows.definition import WorkflowDefinition, WorkflowParamError, registered_workflows
from ..workflows.models import WORKFLOW_OPEN_STATES, Workflow
from . import dynamic, triggers
from .declarations import DatasetError


def start_workflow(name: str, params: dict[str, str], requested_by: str) -> str:
    """One workflow `name` with `params`, started in the caller's transaction."""
    return f"workflow:{services.start(name, params, started_by=f'update of {requested_by}'[:150]).id}"


def consumer_of(definition: WorkflowDefinition) -> triggers.Consumer:
    assert definition.on_update is not None
    return triggers.declared_consumer(
        "workflow",
        definition.name,
        definition.on_update,
        start_workflow,
        params=[p.name for p in definition.params],
        origin=f"workflow {definition.name!r}",
    )


def workflow_consumers() -> Iterator[triggers.Consumer]:
    """A consumer per registered workflow declared with on_update."""
    for definition in registered_workflows():
        if definition.on_update is not None:
            yield consumer_of(definition)


def check_start(definition: Any, params: dict[str, Any]) -> None:
    """workflows/hooks.start_checks: a workflow declared with on_update, started with its partition parameter(s)
    set, names a partition of its upstreams (a dynamic key held FOR SHARE until the workflow is written);
    WorkflowParamError naming the parameter otherwise. A parameter left unset is not checked."""
    if getattr(definition, "on_update", None) is None:
        return
    consumer = consumer_of(definition)
    if consumer.param is None:
        return
    values = [params.get(name) for name in consumer.param.split("|")]
    if any(v is None or v == "" for v in values):
        return
    try:
        triggers.checked_partition(consumer, "|".join(str(v) for v in values))
    except DatasetError as exc:
        raise WorkflowParamError(definition.name, {consumer.param: str(exc)}) from None


def open_workflows(partition_set: str, keys: list[str]) -> list[str]:
    """The open workflows (running, failing, compensating, cancelling) of workflows triggered by a dataset of
    the dynamic set, whose parameters name one of `keys` (a value, or a part of a "day|customer" value)."""
    names = [
        d.name
        for d in registered_workflows()
        if d.on_update is not None and dynamic.uses_set(partition_set, d.on_update.upstreams)
    ]
    if not names:
        return []
    found = Workflow.objects.filter(name__in=names, state__in=WORKFLOW_OPEN_STATES).only("id", "params")
    return [f"workflow:{w.id}" for w in found.order_by("id") if dynamic.names_key(w.params, keys)]


triggers.add_source(workflow_consumers)
dynamic.add_open_runs(open_workflows)
