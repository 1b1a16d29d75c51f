"""Pruning, written once: what a round deletes and how big a batch is. The worker's maintenance units run one
round per transaction under their advisory lock (worker/maintenance.py: prune_done, history_retention); the
`queue_app.prune` task (maintenance_tasks.py, the shipped "prune-done" schedule) runs rounds until nothing is
left or its bound is reached. Each round returns (counts to log or report, whether a full batch suggests more)."""

from .history import drop_expired_partitions, ensure_partitions, prune_history, within_lock_timeout
from .maintenance import prune_dedup_claims, prune_done

PRUNE_BATCH = 10_000  # rows a round deletes at most, per statement


def prune_round() -> tuple[dict[str, int], bool]:
    """Done items past their queue's retention (a batch; their reservations go with them) and expired dedup
    claims."""
    pruned = prune_done(PRUNE_BATCH)
    return {"pruned": pruned, "dedup_claims": prune_dedup_claims()}, pruned >= PRUNE_BATCH


def history_round() -> tuple[dict[str, int], bool]:
    """The partitioned history: partitions created ahead, older rows of queues keeping less than the history
    pruned (a batch), expired days dropped (last: a drop's lock on the history tables lasts until the caller's
    transaction commits)."""
    counts = {
        "partitions_created": within_lock_timeout(ensure_partitions, "partition creation"),
        "history_pruned": prune_history(PRUNE_BATCH),
        "partitions_dropped": within_lock_timeout(lambda: len(drop_expired_partitions()), "partition drop"),
    }
    return counts, counts["history_pruned"] >= PRUNE_BATCH


def prune_rounds(most: int) -> dict[str, int]:
    """Run each round again while it comes back full, at most `most` times each; the counts summed."""
    totals: dict[str, int] = {}
    for round_ in (prune_round, history_round):
        for _ in range(most):
            counts, more = round_()
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
            if not more:
                break
    return totals
