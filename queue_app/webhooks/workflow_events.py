"""A workflow's end as a webhook event, connected by the webhooks app when the workflows app is installed too
(apps.py): `workflow.failed` when it failed, `workflow.finished` when it succeeded or was cancelled."""

from typing import Any

from django.dispatch import receiver

from ..workflows.models import Workflow
from ..workflows.signals import workflow_finished
from .events import publish_event


@receiver(workflow_finished)
def publish_workflow_end(sender: Any, workflow: Workflow, state: str, **kwargs: Any) -> None:
    """A workflow's end as an event: `workflow.failed` when it failed, `workflow.finished` when it succeeded or was
    cancelled (`data.state` says which). Sent from the transactional `queue_app.workflow_finished` item, so the
    deliveries commit with its settle: one event per end."""
    publish_event(
        "workflow.failed" if state == "failed" else "workflow.finished",
        {
            "workflow_id": workflow.id,
            "name": workflow.name,
            "state": state,
            "attempt": workflow.attempt,
            "started_by": workflow.started_by,
            "steps_total": workflow.steps_total,
            "steps_failed": workflow.steps_failed,
            "error": workflow.error[:1000],
        },
    )
