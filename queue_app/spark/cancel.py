"""What cancelling a queue item does to the Spark run it carries: registered on the core's `cancel_requested` hook
(queue_app/hooks.py) by the Spark app's ready(), called by services.cancel_items in its transaction, before the
items are locked (run rows before item rows, as the Spark handler locks them).

A run not started yet is cancelled with its item; a started one goes to `cancelling` and keeps its item, whose
handler stops the spark-submit child (SIGTERM to its process group, SIGKILL after the grace), marks the run
cancelled and settles the item. Cancelling that item outright would have the worker kill the handler and leave
the run's row `running`. A run already `cancelling` is not counted again.
"""

from django.utils import timezone

from .models import SPARK_OPEN_STATES, SparkRun, SparkRunState


def cancel_runs_of_items(item_ids: list[int], actor: str) -> tuple[int, set[int]]:
    """(the cancels asked of running handlers, the items those handlers settle themselves)."""
    runs = list(
        SparkRun.objects.select_for_update().filter(item_id__in=item_ids, state__in=SPARK_OPEN_STATES).order_by("id")
    )
    now = timezone.now()
    asked = 0
    for run in runs:
        if run.state == SparkRunState.QUEUED:  # no child yet: the handler claims the row under its lock first
            run.state, run.finished_at = SparkRunState.CANCELLED, now
            run.error = f"cancelled by {actor} before it started" if actor else "cancelled before it started"
        elif run.state != SparkRunState.CANCELLING:
            run.state = SparkRunState.CANCELLING
            asked += 1
        run.cancel_requested_at = run.cancel_requested_at or now
        run.save(update_fields=["state", "finished_at", "error", "cancel_requested_at"])
    return asked, {run.item_id for run in runs if run.state == SparkRunState.CANCELLING}
