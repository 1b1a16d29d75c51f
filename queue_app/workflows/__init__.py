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
"""

from ..params import Param
from .definition import (
    Graph,
    StepRef,
    UnknownWorkflow,
    WorkflowDefinitionError,
    WorkflowError,
    get_workflow,
    registered_workflows,
    workflow,
)

__all__ = [
    "Graph",
    "Param",
    "StepRef",
    "UnknownWorkflow",
    "WorkflowDefinitionError",
    "WorkflowError",
    "get_workflow",
    "registered_workflows",
    "workflow",
]
