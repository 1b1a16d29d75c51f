"""What produces a dataset, for the staleness detector to start it (issue 38: "a dataset past its freshness policy
... optionally triggers its producer").

A dataset declared with `trigger_producer_when_stale=True` has its producer started for the partition its stale
episode wants (stale.py) once per episode. Producers come from sources, like the triggers' consumers:

- the Spark jobs and scripts in code and settings that declare the dataset in `produces`
  (queue_app/datasets/spark_producers.py, registered when Django is ready);
- the tasks declared with `@job(..., produces=["events"])`: started as one item with payload {"dataset",
  "partition", "params", "reason"}; the item's success records the partition's materialization (record_produced,
  called by the worker: files counted at the location, rows from a result {"rows": N});
- the tasks registered here: `producer_task("myapp.build_events", produces=["events"])`, started as one item with
  payload {"dataset", "partition", "params", "reason"}; such a task records what it wrote itself.

Every start gets the producer's parameters for its partition (producer_params.py: the partition key, the
dataset's declared `params`, then what the caller gives).

A source is called on every lookup: keep it free of database reads (stored scripts are not producers here).
The system check jobsite.E111 (checks.py) reports a dataset with the option and no producer, or several.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from queue_app import engine
from queue_app.registry import registered_tasks

from ..engine.alias import atomic
from . import dynamic
from .declarations import DatasetError, get_dataset
from .locations import LocationError, dataset_roots
from .producer_params import producer_params
from .services import record_materialization, stat_files


@dataclass(frozen=True)
class Producer:
    """Something that writes `dataset`: `start(partition, reason, params)` queues it for one partition in the
    caller's transaction and returns what it started (["spark_run:12"]); `params` (None: none given) are the
    caller's, over the partition's and the declaration's (producer_params.py)."""

    key: str  # kind:name, e.g. spark:daily_revenue, task:myapp.build_events
    dataset: str
    start: Callable[..., list[str]]
    origin: str = ""


_sources: list[Callable[[], Iterable[Producer]]] = []
_tasks: dict[tuple[str, str], Producer] = {}


def add_source(source: Callable[[], Iterable[Producer]]) -> None:
    """Register a function listing producers (called on every lookup)."""
    if source not in _sources:
        _sources.append(source)


def producer_task(task: str, *, produces: Iterable[str]) -> list[Producer]:
    """Make the task `task` the producer of each dataset in `produces`: a stale start enqueues one item with
    payload {"dataset", "partition", "reason"}. Registering the same pair again replaces it."""
    names = [produces] if isinstance(produces, str) else list(produces)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise DatasetError(f"producer task {task!r}: produces names one or more datasets")
    made = []
    for name in names:
        made.append(_task_producer(task, name, f"producer_task({task!r})"))
        _tasks[task, name] = made[-1]
    return made


def _task_producer(task: str, name: str, origin: str) -> Producer:
    def start(partition: str, reason: str, params: Mapping[str, Any] | None = None) -> list[str]:
        ds = get_dataset(name)
        with atomic():  # the key checked in the enqueue's transaction: a dynamic key's row held until it commits
            key = ds.partition_key(partition or None)
            given = producer_params(ds, key, None, params)
            item = engine.enqueue(task, {"dataset": name, "partition": key, "params": given, "reason": reason})
        return [f"item:{item.id}"]

    return Producer(f"task:{task}", name, start, origin=origin)


def declared_task_producers() -> Iterable[Producer]:
    """A producer per (task declared with @job(produces=...), dataset it produces)."""
    for task in registered_tasks().values():
        for name in task.produces:
            yield _task_producer(task.name, name, f"@job({task.name!r}, produces=...)")


def producer_succeeded(task: Any, payload: Any, result: Any, item_id: int) -> None:
    """The core's `hooks.producer_succeeded`: a task declared with `produces=` succeeded (worker/execute.py)."""
    record_produced(task.name, task.produces, payload, result, item_id)


def record_produced(task: str, produces: Iterable[str], payload: Any, result: Any, item_id: int) -> None:
    """The materialization an item of the producer task `task` made, when its payload names a dataset the task
    produces and a partition (an item started by materialize or a stale episode; any other item records nothing).
    Counted at a path location (files and bytes; nothing there: DatasetError, the item fails and nothing is
    recorded); `rows` from a result {"rows": N}. In the caller's transaction, else in one of its own."""
    if not isinstance(payload, Mapping) or payload.get("dataset") not in produces or "partition" not in payload:
        return
    ds = get_dataset(payload["dataset"])
    key = ds.partition_key(payload["partition"] or None)
    files = size = None
    if not ds.location.table:
        try:
            path = ds.location.resolve(key)
        except LocationError as exc:
            raise DatasetError(f"dataset {ds.name!r}: {exc}; nothing recorded") from None
        if not os.path.exists(path):
            raise DatasetError(f"task {task!r} succeeded but wrote nothing at {path}; nothing recorded")
        files, size = stat_files(path, dataset_roots())
    rows = result.get("rows") if isinstance(result, Mapping) else None
    metadata = {"task": task, "params": payload.get("params") or {}}
    with atomic():
        record_materialization(
            ds, key, rows=rows if isinstance(rows, int) else None, files=files, bytes=size,
            metadata=metadata, item_id=item_id,
        )  # fmt: skip


def forget_task(task: str) -> None:
    for key in [k for k in _tasks if k[0] == task]:
        del _tasks[key]


def open_producer_items(partition_set: str, keys: list[str]) -> list[str]:
    """The open items of producer tasks (`@job(produces=...)`, producer_task) started for a dataset of the
    dynamic set whose partition names one of `keys` (dynamic.add_open_runs: its removal is refused meanwhile)."""
    pairs = [(task.name, ds) for task in registered_tasks().values() for ds in task.produces]
    pairs += list(_tasks)
    pairs = [(task, ds) for task, ds in pairs if dynamic.uses_set(partition_set, [ds])]
    return dynamic.open_items(sorted({t for t, _ in pairs}), keys, sorted({d for _, d in pairs}))


dynamic.add_open_runs(open_producer_items)


def producers_of(dataset: str) -> list[Producer]:
    """Every producer of `dataset`, by key."""
    found = {p.key: p for p in _tasks.values() if p.dataset == dataset}
    for source in [declared_task_producers, *_sources]:
        for producer in source():
            if producer.dataset == dataset:
                found.setdefault(producer.key, producer)
    return [found[key] for key in sorted(found)]


def the_producer(dataset: str) -> Producer:
    """The one producer of `dataset`; DatasetError when none or several (jobsite.E111 says so before)."""
    found = producers_of(dataset)
    if len(found) != 1:
        listed = ", ".join(p.key for p in found) or "none"
        raise DatasetError(f"dataset {dataset!r} has {len(found)} producers ({listed}): it needs exactly one")
    return found[0]
