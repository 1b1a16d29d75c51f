"""What the CLI and the admin read about datasets: one summary per dataset and one dataset's history, as the
JSON shapes `dataset list --json` and `dataset show --json` print (issue 38). Every read is index scans of
queue_app_materialization (materialization_latest, materialization_partition), one statement for any number
of datasets.

Checks are "none" until checks exist; the shapes already carry them so the CLI contract does not change when
they arrive. Producers and consumers are the jobs' declarations, which the caller passes in (the jobs build on
datasets, not the other way round).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection

from .declarations import Dataset
from .freshness import freshness_state, overdue_since, staleness_seconds
from .models import Materialization
from .partitions import PartitionError
from .sql import NEWEST, PARTITION_COUNTS, PARTITION_GRID


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class Newest:
    partition: str
    at: dt.datetime


def newest(names: list[str]) -> dict[str, list[Newest]]:
    """What freshness needs of each dataset in `names`: its newest materialization by time and the one of its
    newest partition ([] when it has none)."""
    with connection.cursor() as cursor:
        cursor.execute(NEWEST, [names])
        return {
            name: [Newest(p, at) for p, at in ((a_partition, a_at), (p_partition, p_at)) if at is not None]
            for name, a_partition, a_at, p_partition, p_at in cursor.fetchall()
        }


def summaries(datasets: list[Dataset], now: dt.datetime) -> list[dict[str, Any]]:
    """`dataset list --json`: one entry per dataset, in the order given."""
    latest = newest([ds.name for ds in datasets])
    return [
        {
            "name": ds.name,
            "partitioning": ds.partitioning.describe(),
            "last_materialized": _iso(max((m.at for m in latest[ds.name]), default=None)),
            "freshness": freshness_state(ds, latest[ds.name], now),
            "checks": "none",
        }
        for ds in datasets
    ]


@dataclass(frozen=True)
class Staleness:
    name: str
    freshness: str  # fresh, stale or missing
    seconds: float | None  # past its policy (freshness.staleness_seconds); None: cannot be said (missing)
    overdue_since: dt.datetime | None  # when a stale one went past its policy (freshness.overdue_since)
    last_materialized: dt.datetime | None


def staleness(datasets: list[Dataset], now: dt.datetime) -> list[Staleness]:
    """Per dataset with a freshness policy (others are left out), what /metrics exports and the stale check
    publishes, from one statement."""
    with_policy = [ds for ds in datasets if ds.freshness is not None and not ds.freshness.problems(ds.partitioning)]
    if not with_policy:
        return []
    latest = newest([ds.name for ds in with_policy])
    return [
        Staleness(
            ds.name,
            freshness_state(ds, latest[ds.name], now),
            staleness_seconds(ds, latest[ds.name], now),
            overdue_since(ds, latest[ds.name], now),
            max((m.at for m in latest[ds.name]), default=None),
        )
        for ds in with_policy
    ]


def detail(
    ds: Dataset,
    now: dt.datetime,
    *,
    partition: str | None = None,
    limit: int = 100,
    producers: Iterable[str] = (),
    consumers: Iterable[str] = (),
) -> dict[str, Any]:
    """The dataset and its newest `limit` materializations (of one canonical `partition` when given), with the
    jobs that produce and consume it (their declarations, given by the caller: spark/datasets.users())."""
    rows = Materialization.objects.filter(dataset=ds.name)
    if partition is not None:
        rows = rows.filter(partition=partition)
    history = list(rows.order_by("-at", "-id")[:limit])
    return {
        "name": ds.name,
        "location": ds.location.text,
        "partitioning": ds.partitioning.describe(),
        "producers": sorted(producers),
        "consumers": sorted(consumers),
        "freshness": freshness_state(ds, newest([ds.name])[ds.name], now),
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


PARTITIONS_COUNTED_UP_TO = 10_000  # the admin's list says "10,000+" beyond (one index probe per partition)
GRID_PARTITIONS = 200  # the dataset page's grid: this many of the newest partitions


def partition_counts(names: list[str], cap: int = PARTITIONS_COUNTED_UP_TO) -> dict[str, int]:
    """{name: how many distinct partitions it has materialized}, counted up to cap + 1."""
    with connection.cursor() as cursor:
        cursor.execute(PARTITION_COUNTS, [names, cap])
        return dict(cursor.fetchall())


@dataclass(frozen=True)
class Cell:
    """One partition in the dataset page's grid: its key, its state and its latest materialization (None when
    missing). States: "materialized" (by a run, step, item or code), "observed", "missing". The checks' states
    ("failed checks", "warned") belong here too, from the latest materialization's checks."""

    partition: str
    state: str
    id: int | None = None
    at: dt.datetime | None = None
    rows: int | None = None
    bytes: int | None = None
    spark_run_id: int | None = None


def cell_state(source: str | None) -> str:
    if source is None:
        return "missing"
    return "observed" if source == "observed" else "materialized"


def partition_grid(ds: Dataset, limit: int = GRID_PARTITIONS) -> list[Cell]:
    """The dataset's newest `limit` partitions, oldest first, each with its latest materialization; for a daily
    or hourly dataset the gaps between them are shown as missing, and a static dataset shows every declared key."""
    with connection.cursor() as cursor:
        cursor.execute(PARTITION_GRID, [ds.name, ds.name, limit, ds.name])
        found = {
            row[0]: Cell(row[0], cell_state(row[3]), row[1], row[2], row[4], row[5], row[6])
            for row in cursor.fetchall()
        }
    kind = ds.partitioning.kind
    keys: list[str] = sorted(found)
    if kind == "static":
        keys = sorted(set(ds.partitioning.valid) | set(found))
    elif kind in ("daily", "hourly") and found:
        try:
            keys = sorted(set(ds.partitioning.keys(min(found), max(found))[-limit:]) | set(found))[-limit:]
        except PartitionError:  # keys written under another partitioning
            keys = sorted(found)
    elif kind == "none" and not found:
        keys = [""]
    return [found.get(key) or Cell(key, "missing") for key in keys]
