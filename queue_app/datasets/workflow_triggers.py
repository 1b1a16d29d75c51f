"""Registered workflows as consumers of data-aware triggers (datasets/triggers.py): a workflow declared with
`on_update=` is started for a partition (services.start, its partition parameter set to the key) inside the
transaction that records its last upstream materialization. Registered as a consumer source when Django is
ready (datasets/apps.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..workflows import services
from ..workflows.definition import registered_workflows
from . import triggers


def start_workflow(name: str, param: str | None, partition: str, upstream: Mapping[str, int]) -> list[str]:
    """One workflow `name` for `partition`, started in the caller's transaction."""
    params = {param: partition} if param and partition else {}
    started_by = "update of " + ", ".join(f"{ds} #{mid}" for ds, mid in sorted(upstream.items()))
    return [f"workflow:{services.start(name, params, started_by=started_by[:150]).id}"]


def workflow_consumers() -> Iterator[triggers.Consumer]:
    """A consumer per registered workflow declared with on_update."""
    for definition in registered_workflows():
        if definition.on_update is None:
            continue
        param = next((ref.param for ref in definition.on_update.upstreams if ref.param), None)

        def start(partition: str, upstream: Mapping[str, int], name: str = definition.name, p=param) -> list[str]:
            return start_workflow(name, p, partition, upstream)

        yield triggers.Consumer(
            key=f"workflow:{definition.name}",
            trigger=definition.on_update,
            start=start,
            param=param,
            params=tuple(p.name for p in definition.params),
            origin=f"workflow {definition.name!r}",
        )


triggers.add_source(workflow_consumers)
