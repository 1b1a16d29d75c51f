"""The `dataset.stale` webhook event, sent once per staleness episode, and the producer started once per episode
for a dataset that asks for it (issue 38).

`publish_stale()` judges every declared dataset with a freshness policy (one statement: status.staleness), and
for each stale one records its episode (StaleEpisode, unique per dataset and the instant it went past its policy)
and publishes the event in the same transaction. A dataset that stays stale keeps its overdue_since, so later
checks find the episode recorded and send nothing; two checks running at once insert the same key and the second
waits for the first to commit, then inserts (and sends) nothing; one that rolls back sends nothing. When the
dataset is materialized and goes stale again, it has a new overdue_since: a new episode, a new event. A dataset
never materialized has no overdue instant and no event (its /metrics freshness reads 0).

A dataset declared with `trigger_producer_when_stale=True` also has its producer (producers.py: the one Spark job,
script or task that produces it) started for the wanted partition (status.wanted_partition: the day due now for
partition_by, the newest materialization's partition for max_age) in the same transaction, only by the check that
inserted the episode: so once per episode, however many workers check at once. A producer that cannot start (none,
several, a run refused) leaves its error on the episode row and in the log; the episode and event still commit.

The shipped "dataset-staleness" schedule runs it every minute through the `queue_app.dataset_staleness` task.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from django.utils import timezone

from .. import events
from ..engine.alias import atomic, connection
from .declarations import declared_datasets
from .producers import the_producer
from .sql import STALE_EPISODES, STALE_STARTED
from .status import Staleness, staleness

logger = logging.getLogger("jobsite.datasets")


def publish_stale(now: dt.datetime | None = None) -> list[str]:
    """Publish `dataset.stale` for each dataset whose staleness episode is not recorded yet (and start the producer
    of those that ask for it); returns their names."""
    now = now or timezone.now()
    declared = declared_datasets()
    with atomic():
        stale = {s.name: s for s in staleness(list(declared.values()), now) if s.overdue_since is not None}
        if not stale:
            return []
        with connection.cursor() as cursor:
            cursor.execute(STALE_EPISODES, [list(stale), [s.overdue_since for s in stale.values()]])
            new = dict(sorted(cursor.fetchall()))
        for name, episode_id in new.items():
            s = stale[name]
            if declared[name].trigger_producer_when_stale:
                start_producer(s, episode_id)
            events.publish(
                "dataset.stale",
                {
                    "dataset": name,
                    "freshness_policy": declared[name].freshness.describe(),
                    "overdue_since": s.overdue_since.isoformat(),
                    "last_materialized": s.last_materialized.isoformat() if s.last_materialized else None,
                    "staleness_seconds": s.seconds,
                },
            )
        return list(new)


def start_producer(s: Staleness, episode_id: int) -> list[str]:
    """Start the producer of the stale dataset `s` for its wanted partition, in a savepoint of the episode's
    transaction, and write what it started (or why not) on the episode row."""
    started, error = [], ""
    reason = f"stale dataset {s.name} (overdue since {s.overdue_since:%Y-%m-%d %H:%M} UTC)"
    try:
        with atomic():
            started = list(the_producer(s.name).start(s.partition or "", reason))
    except Exception as exc:  # noqa: BLE001 - the episode and its event commit; the row keeps the error
        error = f"{type(exc).__name__}: {exc}"[:2000]
        logger.error("stale dataset %s[%s]: its producer could not start: %s", s.name, s.partition, error)
    else:
        logger.info("stale dataset %s[%s]: started its producer: %s", s.name, s.partition, started)
    with connection.cursor() as cursor:
        cursor.execute(STALE_STARTED, [s.partition or "", json.dumps(started), error, episode_id])
    return started
