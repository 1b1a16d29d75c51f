"""What the CLI and the admin read about datasets: one summary per dataset and one dataset's history, as the
JSON shapes `dataset list --json` and `dataset show --json` print (issue 38). Every read is index scans of
queue_app_materialization (materialization_latest, materialization_partition), one statement for any number
of datasets.

`checks` is a materialization's checks state (datasets/checks_run.py: none, pending, passed, warned, failed,
overridden; check_results() gives each check's result, for the text output); a dataset's, in the list, is its
newest materialization's as the list's contract has it: passed, warned (an override too: usable, but a check
failed), failed, or none (no checks, not yet run, or never materialized).

Producers and consumers are the jobs' declarations, which the caller passes in (the jobs build on datasets, not
the other way round).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..engine.alias import connection
from .declarations import Dataset
from .freshness import freshness_state, overdue_since, staleness_seconds
from .models import CheckState, DatasetCheckResult, Materialization
from .partitions import MultiPartitions, PartitionError, all_keys
from .sql import MATRIX_GRID, NEWEST, PARTITION_COUNTS, PARTITION_COUNTS_SCAN, PARTITION_GRID


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class Newest:
    partition: str
    at: dt.datetime


def newest(names: list[str]) -> dict[str, list[Newest]]:
    """What freshness needs of each dataset in `names`: its newest materialization by time and the one of its
    newest partition ([] when it has none)."""
    return _newest(names)[0]


LIST_CHECKS = {CheckState.PASSED: "passed", CheckState.WARNED: "warned", CheckState.OVERRIDDEN: "warned"}
LIST_CHECKS |= {CheckState.FAILED: "failed"}


def _newest(names: list[str]) -> tuple[dict[str, list[Newest]], dict[str, str]]:
    """newest() and {dataset: the list's checks value of its newest materialization}, from one statement."""
    with connection.cursor() as cursor:
        cursor.execute(NEWEST, [names])
        rows = cursor.fetchall()
    latest = {
        name: [Newest(p, at) for p, at in ((a_partition, a_at), (p_partition, p_at)) if at is not None]
        for name, a_partition, a_at, p_partition, p_at, _checks in rows
    }
    return latest, {row[0]: LIST_CHECKS.get(row[5], "none") for row in rows}


def check_results(materialization_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Each materialization's check results, by check name."""
    found: dict[int, list[dict[str, Any]]] = {m: [] for m in materialization_ids}
    for r in DatasetCheckResult.objects.filter(materialization_id__in=materialization_ids).order_by("check_name"):
        found[r.materialization_id].append(
            {
                "check": r.check_name,
                "severity": r.severity,
                "blocking": r.blocking,
                "passed": r.passed,
                "figures": r.figures,
                "message": r.message,
                "at": _iso(r.at),
            }
        )
    return found


def summaries(datasets: list[Dataset], now: dt.datetime) -> list[dict[str, Any]]:
    """`dataset list --json`: one entry per dataset, in the order given."""
    latest, checked = _newest([ds.name for ds in datasets])
    return [
        {
            "name": ds.name,
            "partitioning": ds.partitioning.describe(),
            "last_materialized": _iso(max((m.at for m in latest[ds.name]), default=None)),
            "freshness": freshness_state(ds, latest[ds.name], now),
            "checks": checked.get(ds.name, "none"),
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
    partition: str | None = None  # what a producer started for it would write (wanted_partition)


def wanted_partition(ds: Dataset, latest: list[Newest], now: dt.datetime) -> str | None:
    """The partition a stale dataset's producer is started for: for partition_by, the day due now (the missing
    one); for max_age, the partition of its newest materialization (the stale one). None when there is none."""
    if ds.freshness is None or not latest:
        return None
    if ds.freshness.partition_by is not None:
        return ds.freshness.due_partition(now)
    return latest[0].partition  # newest() lists the newest by time first


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
            wanted_partition(ds, latest[ds.name], now),
        )
        for ds in with_policy
    ]


def history(ds: Dataset, *, partition: str | None = None, limit: int = 100) -> list[Materialization]:
    """The dataset's newest `limit` materializations (of one canonical `partition` when given)."""
    rows = Materialization.objects.filter(dataset=ds.name)
    if partition is not None:
        rows = rows.filter(partition=partition)
    return list(rows.order_by("-at", "-id")[:limit])


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
    jobs that produce and consume it (their declarations, given by the caller: datasets/spark_runs.users())."""
    newest_first = history(ds, partition=partition, limit=limit)
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
                "checks": m.checks,
            }
            for m in newest_first
        ],
    }


PARTITIONS_COUNTED_UP_TO = 10_000  # the admin's list says "10,000+" beyond (one index probe per partition)
GRID_PARTITIONS = 200  # the dataset page's grid: this many of the newest partitions
GRID_GAP = 14  # a longer run of never-materialized daily or hourly partitions is one gap cell in the grid


PARTITIONS_SCANNED = 2_000  # materializations read per dataset before counting its partitions by probes


def partition_counts(
    names: list[str], cap: int = PARTITIONS_COUNTED_UP_TO, scanned: int = PARTITIONS_SCANNED
) -> dict[str, int]:
    """{name: how many distinct partitions it has materialized}, counted up to cap + 1. A dataset with at most
    `scanned` materializations is counted from its index entries (one index-only scan: a few microseconds a
    row); one with more by a loose index scan (one probe per partition, however many materializations each
    has), so the cost is bounded either way."""
    with connection.cursor() as cursor:
        cursor.execute(PARTITION_COUNTS_SCAN, [names, scanned])
        counts, more = {}, []
        for name, n, read in cursor.fetchall():
            counts[name] = n
            if read >= scanned:
                more.append(name)
        if more:
            cursor.execute(PARTITION_COUNTS, [more, cap])
            counts.update(cursor.fetchall())
    return counts


@dataclass(frozen=True, slots=True)  # slots: a matrix page makes 1,550 of them
class Cell:
    """One partition in the dataset page's grid: its key, its state and its latest materialization (None when
    missing). States: "materialized" (by a run, step, item or code), "observed", "missing", and from the latest
    materialization's checks "failed-checks" (a blocking check failed) and "checks-pending" (still running).
    A "gap" cell stands for `count` missing partitions in a row, `partition` to `until`; an "older" one for
    `count` partitions past the grid's limit (none of them failed its checks: those keep their own cells)."""

    partition: str
    state: str
    id: int | None = None
    at: dt.datetime | None = None
    rows: int | None = None
    bytes: int | None = None
    spark_run_id: int | None = None
    checks: str = CheckState.NONE
    until: str = ""
    count: int = 0


def cell_state(source: str | None, checks: str | None = None) -> str:
    if source is None:
        return "missing"
    if checks == CheckState.FAILED:
        return "failed-checks"
    if checks == CheckState.PENDING:
        return "checks-pending"
    return "observed" if source == "observed" else "materialized"


def partition_grid(ds: Dataset, limit: int = GRID_PARTITIONS, now: dt.datetime | None = None) -> list[Cell]:
    """The dataset's newest `limit` materialized partitions, oldest first, each with its latest materialization. A
    daily or hourly dataset shows the range that exists: from its first materialized partition (of those) to the
    last complete one before `now`, the missing partitions between as missing cells, a run of more than GRID_GAP
    of them as one gap cell, so a partition materialized long ago (a failed backfill day) stays on the grid
    beside the recent ones. A static dataset shows every declared key."""
    with connection.cursor() as cursor:
        cursor.execute(PARTITION_GRID, [ds.name, ds.name, limit, ds.name])
        found = {
            row[0]: Cell(row[0], cell_state(row[3], row[7]), row[1], row[2], row[4], row[5], row[6], row[7])
            for row in cursor.fetchall()
        }
    kind = ds.partitioning.kind
    if kind in ("daily", "hourly", "weekly") and found:
        try:
            return _time_grid(ds.partitioning, found, now or dt.datetime.now(dt.UTC), limit)
        except PartitionError:  # keys written under another partitioning
            pass
    keys: list[str] = sorted(found)
    if kind == "static":
        keys = sorted(set(ds.partitioning.valid) | set(found))
    elif kind == "none" and not found:
        keys = [""]
    return [found.get(key) or Cell(key, "missing") for key in keys]


def _time_grid(partitioning: Any, found: dict[str, Cell], now: dt.datetime, limit: int) -> list[Cell]:
    """The cells of a daily or hourly grid (partition_grid): every found key, the missing keys between and up to
    the last complete partition, long runs of missing ones as gap cells; the newest `limit` cells, and of the
    older ones those whose checks failed, the rest as "older" cells between them."""
    step = partitioning.step
    last_complete = partitioning.key(now - step)
    keys = sorted(found)
    ends = keys + ([last_complete] if last_complete > keys[-1] else [])
    cells: list[Cell] = []
    for before, key in zip([None, *ends], ends, strict=False):
        if before is not None:
            start = partitioning.parse(before) + step
            missing = (partitioning.parse(key) - start) // step
            if 0 < missing <= GRID_GAP:
                cells += [Cell(partitioning.text(start + i * step), "missing") for i in range(missing)]
            elif missing > GRID_GAP:
                until = partitioning.text(partitioning.parse(key) - step)
                cells.append(Cell(partitioning.text(start), "gap", until=until, count=missing))
        cells.append(found.get(key) or Cell(key, "missing"))
    if len(cells) <= limit:
        return cells
    shown: list[Cell] = []
    for cell in cells[:-limit]:  # past the limit: the failed partitions, what lies between them as gap cells
        if cell.state == "failed-checks":
            shown.append(cell)
            continue
        count = cell.count or 1
        if shown and shown[-1].state == "older":
            gap = shown.pop()
            shown.append(Cell(gap.partition, "older", until=cell.until or cell.partition, count=gap.count + count))
        else:
            shown.append(Cell(cell.partition, "older", until=cell.until or cell.partition, count=count))
    return shown + cells[-limit:]


MATRIX_ROWS = 31  # a multi-dimension dataset's grid: this many time rows (newest), gaps and failures besides
MATRIX_COLUMNS = 50  # and this many keys of its other dimensions
MATRIX_CAP = 20_000  # partitions read for it at most (the newest)


@dataclass(frozen=True)
class Matrix:
    """A multi-dimension dataset's grid: time rows by the other dimensions' keys (partition_matrix). `rows` are
    Cells of the time dimension (a "gap" or "older" row stands for several); `cells[(time key, column)]` the
    partition's Cell; `more_columns` the keys left out past MATRIX_COLUMNS."""

    time_dimension: str
    column_dimensions: list[str]
    columns: list[str]
    rows: list[Cell]
    cells: dict[tuple[str, str], Cell]
    more_columns: int = 0
    time_index: int = 0

    def key(self, time_key: str, column: str) -> str:
        """The partition key of a cell: the time key at its dimension's place among the column's keys."""
        parts = column.split("|") if column else []
        parts.insert(self.time_index, time_key)
        return "|".join(parts)


SEVERITY = ["materialized", "observed", "checks-pending", "missing", "failed-checks"]  # a row's worst state


def partition_matrix(ds: Dataset, now: dt.datetime | None = None) -> Matrix | None:
    """The grid of a multi-dimension dataset with a time dimension: the range of time that exists (as
    partition_grid: from the first materialized row to the last complete one, long runs of missing rows as one gap
    row, failed rows kept past the limit) by the keys of its other dimensions (declared static keys, current
    dynamic ones and any found). None for another partitioning."""
    part = ds.partitioning
    if not isinstance(part, MultiPartitions) or part.time is None:
        return None
    index, time = part.time
    others = [n for i, n in enumerate(part.names) if i != index]
    columns_known: set[str] = set()
    axes = []
    for i, (_n, p) in enumerate(part.dimensions):
        if i != index:
            try:
                axes.append(all_keys(p))
            except PartitionError:
                axes.append([])
    if len(axes) == 1:
        columns_known = set(axes[0])
    with connection.cursor() as cursor:
        if index == 0:  # the time dimension first: its newest keys, then one range scan
            cursor.execute(MATRIX_GRID, {"ds": ds.name, "rows": MATRIX_ROWS, "cap": MATRIX_CAP})
        else:  # the newest partitions by key, as the one-dimension grid reads them
            limit = MATRIX_ROWS * max(1, min(len(columns_known) or MATRIX_COLUMNS, MATRIX_COLUMNS))
            cursor.execute(PARTITION_GRID, [ds.name, ds.name, limit, ds.name])
        found = cursor.fetchall()
    # (1,550 cells for the page: the loop kept to what each needs, the rows' worst states ranked by a dict)
    cells, worst, width = {}, {}, len(part.names)
    rank = {state: i for i, state in enumerate(SEVERITY)}.__getitem__
    for row in found:
        parts = row[0].split("|")
        if len(parts) != width:
            continue  # written under another partitioning
        key_time = parts[index]
        column = row[0][len(key_time) + 1 :] if index == 0 else "|".join(parts[:index] + parts[index + 1 :])
        state = cell_state(row[3], row[7])
        cells[key_time, column] = Cell(row[0], state, row[1], row[2], row[4], row[5], row[6], row[7])
        columns_known.add(column)
        was = worst.get(key_time)
        if was is None or rank(state) > rank(was):
            worst[key_time] = state
    rows_found = {key: Cell(key, state) for key, state in worst.items()}
    columns = sorted(columns_known)
    rows: list[Cell] = []
    if rows_found:
        try:
            rows = _time_grid(time, rows_found, now or dt.datetime.now(dt.UTC), MATRIX_ROWS)
        except PartitionError:
            rows = [rows_found[k] for k in sorted(rows_found)]
    return Matrix(
        part.names[index],
        others,
        columns[:MATRIX_COLUMNS],
        rows,
        cells,
        max(0, len(columns) - MATRIX_COLUMNS),
        index,
    )
