"""The `dataset.stale` webhook event, sent once per staleness episode (issue 38).

`publish_stale()` judges every declared dataset with a freshness policy (one statement: status.staleness), and
for each stale one records its episode (StaleEpisode, unique per dataset and the instant it went past its policy)
and publishes the event in the same transaction. A dataset that stays stale keeps its overdue_since, so later
checks find the episode recorded and send nothing; two checks running at once insert the same key and the second
waits for the first to commit, then inserts (and sends) nothing; one that rolls back sends nothing. When the
dataset is materialized and goes stale again, it has a new overdue_since: a new episode, a new event. A dataset
never materialized has no overdue instant and no event (its /metrics freshness reads 0).

The shipped "dataset-staleness" schedule runs it every minute through the `queue_app.dataset_staleness` task.
"""

from __future__ import annotations

import datetime as dt

from django.db import connection, transaction
from django.utils import timezone

from ..webhooks.events import publish_event
from .declarations import declared_datasets
from .sql import STALE_EPISODES
from .status import staleness


def publish_stale(now: dt.datetime | None = None) -> list[str]:
    """Publish `dataset.stale` for each dataset whose staleness episode is not recorded yet; returns their names."""
    now = now or timezone.now()
    declared = declared_datasets()
    with transaction.atomic():
        stale = {s.name: s for s in staleness(list(declared.values()), now) if s.overdue_since is not None}
        if not stale:
            return []
        with connection.cursor() as cursor:
            cursor.execute(STALE_EPISODES, [list(stale), [s.overdue_since for s in stale.values()]])
            new = sorted(name for (name,) in cursor.fetchall())
        for name in new:
            s = stale[name]
            publish_event(
                "dataset.stale",
                {
                    "dataset": name,
                    "freshness_policy": declared[name].freshness.describe(),
                    "overdue_since": s.overdue_since.isoformat(),
                    "last_materialized": s.last_materialized.isoformat() if s.last_materialized else None,
                    "staleness_seconds": s.seconds,
                },
            )
        return new
