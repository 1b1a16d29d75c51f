"""The datasets app's tasks, found by the task registry in every installed app's `tasks.py`: a debounced
trigger's delayed item (triggers.py), `queue_app.dataset_trigger_due`, and the checks' task
`queue_app.dataset_check` (checks_run.py). The names keep the `queue_app.` prefix items already queued carry."""

from typing import Any

from queue_app.registry import Context, job

from . import checks_run as _checks_run  # noqa: F401  registers queue_app.dataset_check
from .triggers import TIMER_TASK, due_timer


@job(TIMER_TASK)
def dataset_trigger_due(payload: Any, ctx: Context) -> dict[str, Any]:
    """Fire a debounced trigger's pending upstream set, or queue the timer again if updates pushed it back."""
    done = due_timer(str(payload["consumer"]), str(payload["partition"]), ctx.item_id)
    if done is None or isinstance(done, str):
        return {"fired": False, "why": done or "nothing pending"}
    return {"fired": True, "started": done.started, "error": done.error}
