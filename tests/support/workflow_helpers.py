"""A workflow waited to its end, its steps by name and its items by step: for the workflow tests."""

from queue_app.models import QueueItem
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.waiting import wait_for
from tests.tasks import workflow_tasks  # noqa: F401  (registers the wf.* tasks and workflows)


def finished(workflow_id: int, timeout: float = 60) -> Workflow:
    def done():
        w = Workflow.objects.get(id=workflow_id)
        return w if w.is_final else None

    return wait_for(done, timeout, what=f"workflow {workflow_id} to end")


def steps(w: Workflow, attempt: int | None = None) -> dict[str, WorkflowStep]:
    rows = WorkflowStep.objects.filter(workflow=w, attempt=attempt or w.attempt)
    return {s.name: s for s in rows}


def items_of(w: Workflow) -> dict[str, list[QueueItem]]:
    ids = WorkflowStep.objects.filter(workflow=w).values("id")
    out: dict[str, list[QueueItem]] = {}
    names = dict(WorkflowStep.objects.filter(workflow=w).values_list("id", "name"))
    for item in QueueItem.objects.filter(workflow_step_id__in=ids):
        out.setdefault(names[item.workflow_step_id], []).append(item)
    return out
