"""What the CLI and the admin read about datasets: one summary per dataset and one dataset's history, as the
JSON shapes `dataset list --json` and `dataset show --json` print (issue 38). Every read is an index scan of
queue_app_materialization (materialization_latest, materialization_partition).

Producers, consumers and checks are empty ("none") until jobs declare what they produce and consume and checks
exist; the shapes already carry them so the CLI contract does not change when they arrive.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .declarations import Dataset
from .freshness import freshness_state
from .models import Materialization


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def newest(ds: Dataset) -> list[Materialization]:
    """What freshness needs: the newest materialization by time and the one of the newest partition."""
    rows = Materialization.objects.filter(dataset=ds.name)
    return [m for m in (rows.order_by("-at", "-id").first(), rows.order_by("-partition").first()) if m]


def summary(ds: Dataset, now: dt.datetime) -> dict[str, Any]:
    latest = newest(ds)
    return {
        "name": ds.name,
        "partitioning": ds.partitioning.describe(),
        "last_materialized": _iso(max((m.at for m in latest), default=None)),
        "freshness": freshness_state(ds, latest, now),
        "checks": "none",
    }


def detail(ds: Dataset, now: dt.datetime, *, partition: str | None = None, limit: int = 100) -> dict[str, Any]:
    """The dataset and its newest `limit` materializations (of one canonical `partition` when given)."""
    rows = Materialization.objects.filter(dataset=ds.name)
    if partition is not None:
        rows = rows.filter(partition=partition)
    history = list(rows.order_by("-at", "-id")[:limit])
    return {
        "name": ds.name,
        "location": ds.location.text,
        "partitioning": ds.partitioning.describe(),
        "producers": [],
        "consumers": [],
        "freshness": freshness_state(ds, newest(ds), now),
        "materializations": [
            {
                "partition": m.partition,
                "at": _iso(m.at),
                "rows": m.rows,
                "bytes": m.bytes,
                "files": m.files,
                "run_id": m.spark_run_id,
                "step_id": m.workflow_step_id,
                "checks": "none",
            }
            for m in history
        ],
    }
