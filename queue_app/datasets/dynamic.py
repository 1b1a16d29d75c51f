"""Dynamic partition sets: keys added and removed at run time, from code, the CLI (`dataset partitions`), a watch
(watches.py: a new folder becomes a key) or the admin. One function each, shared by them all.

    from queue_app.datasets import dynamic
    dynamic.add_keys("customers", ["acme", "globex"], by="code")
    dynamic.remove_keys("customers", ["globex"], by="cli:alice")

A key is a row (models.DynamicPartitionKey) from its addition to its removal; a removed key keeps its row and its
materializations (history), takes no new materialization (partitions.DynamicPartitions.key reads the current
keys here, FOR SHARE inside a transaction) and may be added again (a new row).

Removal locks the key's row FOR UPDATE and refuses while a run of the key is open: the checks registered with
add_open_runs name them, the Spark jobs' runs (spark_triggers.py), the workflows' (workflow_triggers.py: those
triggered by a dataset of the set), the items of trigger tasks (here) and of producer tasks (`@job(produces=)`,
producer_task: producers.py). Every start of a key validates it in the start's own transaction, so holds the row
FOR SHARE until the start commits: a Spark run's trigger (spark/runs.trigger_run), a workflow's start (the core's
workflows/hooks.start_checks), a trigger's fire (triggers.declared_consumer, in the recorder's transaction), a
producer task's item (producers.py) and a materialization's record. A removal arriving meanwhile waits for that
transaction, then sees its run and refuses; a start arriving after the removal took its lock waits for it, then
finds the key gone and refuses. `removed_at` is the clock after the lock and the checks (clock_timestamp()): every
start of the key's earlier life began before it and had ended by then, and none began after it (until the key is
added again): what `queue_chaos --triggers` checks (jobsite/chaos/trigger_checks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..engine.alias import atomic, connection
from . import partitions
from .declarations import Dataset, DatasetError, get_dataset
from .models import DynamicPartitionKey
from .partitions import DynamicPartitions, MultiPartitions, PartitionError
from .triggers import consumers

MAX_KEYS = 10_000  # keys one call may add or remove

CURRENT_KEYS = """
SELECT key FROM queue_app_dynamicpartitionkey
WHERE partition_set = %s AND removed_at IS NULL AND (%s::text[] IS NULL OR key = ANY(%s::text[]))
"""

ADD_KEYS = """
INSERT INTO queue_app_dynamicpartitionkey (partition_set, key, added_at, added_by, removed_by)
SELECT %s, k, now(), %s, '' FROM unnest(%s::text[]) AS k
WHERE NOT (%s AND EXISTS (SELECT 1 FROM queue_app_dynamicpartitionkey d WHERE d.partition_set = %s AND d.key = k))
ON CONFLICT (partition_set, key) WHERE removed_at IS NULL DO NOTHING
RETURNING key
"""

LOCK_KEYS = """
SELECT id, key FROM queue_app_dynamicpartitionkey
WHERE partition_set = %s AND key = ANY(%s::text[]) AND removed_at IS NULL
ORDER BY key FOR UPDATE
"""

REMOVE_KEYS = """
UPDATE queue_app_dynamicpartitionkey SET removed_at = clock_timestamp(), removed_by = %s WHERE id = ANY(%s)
"""


class Lookup:
    """The current keys of a set, for partitions.DynamicPartitions (installed below). Inside a transaction the
    rows read are held FOR SHARE, so a removal waits for the transaction that used the key."""

    def keys(self, name: str, wanted: list[str] | None) -> set[str]:
        sql = CURRENT_KEYS + (" FOR SHARE" if connection.in_atomic_block and wanted is not None else "")
        with connection.cursor() as cursor:
            cursor.execute(sql, [name, wanted, wanted])
            return {row[0] for row in cursor.fetchall()}


partitions.dynamic_lookup = Lookup()


def add_open_runs(check: Callable[[str, list[str]], list[str]]) -> None:
    """Register `check(set name, keys) -> ["spark_run:12 (key acme)", ...]`: the open runs of those keys."""
    if check not in _open_runs:
        _open_runs.append(check)


OPEN_TASK_ITEMS = """
SELECT id, payload->>'partition' FROM queue_app_queueitem
WHERE task = ANY(%s::text[]) AND state IN ('ready', 'reserved') AND payload ? 'partition'
  AND (%s::text[] IS NULL OR payload->>'dataset' = ANY(%s::text[]))
"""


def open_items(tasks: list[str], keys: list[str], datasets: list[str] | None = None) -> list[str]:
    """["item:12", ...]: the open (ready or reserved) items of `tasks` whose payload's partition names one of
    `keys` (the key, or a part of a "day|customer" key); with `datasets`, only those whose payload's dataset is
    one of them (a producer's items, started for a dataset)."""
    if not tasks:
        return []
    with connection.cursor() as cursor:
        cursor.execute(OPEN_TASK_ITEMS, [tasks, datasets, datasets])
        return [f"item:{i}" for i, partition in cursor.fetchall() if names_key({"p": partition}, keys)]


def names_key(params: Any, keys: Iterable[str]) -> bool:
    """Whether a run's parameters (a dict) name one of `keys`: a value, or a part of a "day|customer" value."""
    values = {part for v in (params or {}).values() if isinstance(v, str) for part in v.split("|")}
    return bool(values & set(keys))


def uses_set(partition_set: str, refs: Iterable[Any]) -> bool:
    """Whether one of the dataset references `refs` (DatasetRef, or a dataset name) names a dataset partitioned
    by the dynamic set (in one of its dimensions); an unknown dataset names none."""
    for ref in refs:
        try:
            ds = get_dataset(ref if isinstance(ref, str) else ref.name)
        except DatasetError:
            continue
        if any(p.name == partition_set for _n, p in sets_of(ds)):
            return True
    return False


def _open_task_items(partition_set: str, keys: list[str]) -> list[str]:
    """The open items of trigger tasks (triggers.trigger_task) whose partition names one of `keys`."""
    return open_items([c.key[len("task:") :] for c in consumers().values() if c.key.startswith("task:")], keys)


_open_runs: list[Callable[[str, list[str]], list[str]]] = [_open_task_items]


def sets_of(ds: Dataset) -> list[tuple[str, DynamicPartitions]]:
    """(dimension name or "", partitioning) of each dynamic dimension of a dataset."""
    part = ds.partitioning
    if isinstance(part, DynamicPartitions):
        return [("", part)]
    if isinstance(part, MultiPartitions):
        return [(n, p) for n, p in part.dimensions if isinstance(p, DynamicPartitions)]
    return []


def set_of(name: str, dimension: str | None = None) -> str:
    """The dynamic set a dataset `name` (or a set's own name, prefixed "set:") partitions by; DatasetError when
    it has none, or several and `dimension` does not say which."""
    if name.startswith("set:"):
        return _checked_set(name[4:])
    ds = get_dataset(name)
    found = sets_of(ds)
    if dimension:
        found = [(n, p) for n, p in found if n == dimension]
    if not found:
        which = f" dimension {dimension!r}" if dimension else ""
        raise DatasetError(f"dataset {ds.name!r}{which}: not partitioned by a dynamic set")
    if len(found) > 1:
        raise DatasetError(f"dataset {ds.name!r} has several dynamic dimensions: name one ({[n for n, _ in found]})")
    return found[0][1].name


def _checked_set(name: str) -> str:
    problems = DynamicPartitions(name).problems()
    if problems:
        raise DatasetError(problems[0])
    return name


def _keys(keys: Iterable[Any], part: DynamicPartitions) -> list[str]:
    keys = list(keys)
    if not keys:
        raise DatasetError("give at least one key")
    if len(keys) > MAX_KEYS:
        raise DatasetError(f"{len(keys)} keys; at most {MAX_KEYS} at once")
    try:
        return sorted({part.syntax(k) for k in keys})
    except PartitionError as exc:
        raise DatasetError(str(exc)) from None


def add_keys(partition_set: str, keys: Iterable[Any], *, by: str = "code", never_seen: bool = False) -> list[str]:
    """Add `keys` to the set (all checked first: a bad one adds nothing); returns those that were new. With
    `never_seen` (a watch), a key once removed is not added back."""
    name = _checked_set(partition_set)
    wanted = _keys(keys, DynamicPartitions(name))
    with atomic(), connection.cursor() as cursor:
        cursor.execute(ADD_KEYS, [name, by[:150], wanted, never_seen, name])
        return sorted(row[0] for row in cursor.fetchall())


def remove_keys(partition_set: str, keys: Iterable[Any], *, by: str = "code") -> list[str]:
    """Remove `keys` from the set, all or none: DatasetError naming a key that is not in it, or the open runs of
    one (nothing removed). Their rows and materializations stay; returns the keys removed."""
    name = _checked_set(partition_set)
    wanted = _keys(keys, DynamicPartitions(name))
    with atomic(), connection.cursor() as cursor:
        cursor.execute(LOCK_KEYS, [name, wanted])
        rows = cursor.fetchall()
        missing = sorted(set(wanted) - {key for _id, key in rows})
        if missing:
            raise DatasetError(f"not in the dynamic set {name!r}: {', '.join(missing[:20])}; nothing removed")
        open_runs = [run for check in _open_runs for run in check(name, wanted)]
        if open_runs:
            raise DatasetError(
                f"a run of these keys is open ({', '.join(open_runs[:10])}): removal refused; nothing removed"
            )
        cursor.execute(REMOVE_KEYS, [by[:150], [row_id for row_id, _key in rows]])
    return wanted


def list_keys(partition_set: str, *, history: bool = False) -> list[dict[str, Any]]:
    """The set's keys (with removed ones when `history`), as the CLI's --json shows them."""
    name = _checked_set(partition_set)
    rows = DynamicPartitionKey.objects.filter(partition_set=name).order_by("key", "-id")
    if not history:
        rows = rows.filter(removed_at__isnull=True)
    return [
        {
            "key": r.key,
            "added_at": r.added_at.isoformat(),
            "added_by": r.added_by,
            "removed_at": r.removed_at.isoformat() if r.removed_at else None,
            "removed_by": r.removed_by,
        }
        for r in rows
    ]
