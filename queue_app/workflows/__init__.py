"""Workflows: graphs of steps (queue tasks and Spark runs) kept as rows and moved forward by the database in the
transaction that settles each step's item (the functions and triggers that do it: sql.py). See README
"Workflows".

    from queue_app.workflows import Param, workflow

    @workflow("nightly", params=[Param("day", "date", required=True)])
    def nightly(wf, params):
        files = wf.task("shop.land", {"day": str(params["day"])})
        wf.spark("file_rollup", {...}, after=[files])

    from queue_app.workflows import services
    services.start("nightly", {"day": "2026-11-24"}, started_by="me")

An app of its own (apps.py): `INSTALLED_APPS += ["queue_app.spark", "queue_app.workflows"]` after `queue_app`.
The names below are looked up when first used (PEP 562): Django imports this package before the models may load,
and the definitions import the models.
"""

from typing import Any

_FROM_DEFINITION = (
    "Graph",
    "StepRef",
    "UnknownWorkflow",
    "WorkflowDefinitionError",
    "WorkflowError",
    "get_workflow",
    "registered_workflows",
    "workflow",
)
__all__ = ["Param", *_FROM_DEFINITION]


def __getattr__(name: str) -> Any:
    if name == "Param":
        from ..params import Param

        return Param
    if name in _FROM_DEFINITION:
        from . import definition

        return getattr(definition, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
