"""Built-in maintenance tasks a schedule can name: `queue_app.prune` (the shipped "prune-done" schedule),
`queue_app.dataset_staleness` (the shipped "dataset-staleness" schedule) and `queue_app.dataset_watch` (the shipped
"dataset-watch" schedule: datasets/watches.py).

The worker's own maintenance units prune too, with the same rounds (engine/pruning.py); the task lets an operator
see, time and trigger pruning from the admin like any other schedule, and run it on a cluster whose workers run
with --no-scheduler elsewhere.
"""

from typing import Any

from . import engine, hooks
from .registry import Context, job

PRUNE_ROUNDS = 100  # at most a million done items per run (rounds of engine.PRUNE_BATCH); the next fire takes the rest


@job("queue_app.prune", hard_timeout=300.0)
def prune(payload: Any, ctx: Context) -> dict[str, int]:
    """Delete done items past their queue's retention (in batches), the partitioned history's expired days
    (and older rows of queues keeping less), expired dedup claims, and what the layers prune (hooks.prunes: the
    Spark app's runs past their job's history retention, policy keep_days, with their event logs, and the event
    logs of other runs past SPARK_EVENT_LOG_KEEP_DAYS)."""
    return {**engine.prune_rounds(PRUNE_ROUNDS), **{name: prune() for name, prune in hooks.prunes.items()}}


@job("queue_app.dataset_staleness", hard_timeout=60.0)
def dataset_staleness(payload: Any, ctx: Context) -> dict[str, Any]:
    """Send `dataset.stale` for each dataset that went past its freshness policy since the last check (once per
    staleness episode: datasets/stale.py), through the datasets app's maintenance unit (hooks.py). The shipped
    "dataset-staleness" schedule runs it every minute; without the datasets app it says "skipped"."""
    return hooks.run_maintenance("dataset_staleness")


@job("queue_app.dataset_watch", hard_timeout=60.0)
def dataset_watch(payload: Any, ctx: Context) -> dict[str, Any]:
    """Observe each file-arrival watch's partitions whose set of files is new (once per set: datasets/watches.py),
    through the datasets app's maintenance unit. The shipped "dataset-watch" schedule runs it every minute."""
    return hooks.run_maintenance("dataset_watch")
