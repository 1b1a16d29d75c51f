"""What produces a dataset, for the staleness detector to start it (issue 38: "a dataset past its freshness policy
... optionally triggers its producer").

A dataset declared with `trigger_producer_when_stale=True` has its producer started for the partition its stale
episode wants (stale.py) once per episode. Producers come from sources, like the triggers' consumers:

- the Spark jobs and scripts in code and settings that declare the dataset in `produces`
  (queue_app/spark/producers.py, registered when Django is ready);
- the tasks registered here: `producer_task("myapp.build_events", produces=["events"])`, started as one item with
  payload {"dataset", "partition", "reason": "stale"}.

A source is called on every lookup: keep it free of database reads (stored scripts are not producers here).
The system check jobsite.E111 (checks.py) reports a dataset with the option and no producer, or several.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from queue_app import engine

from .declarations import DatasetError


@dataclass(frozen=True)
class Producer:
    """Something that writes `dataset`: `start(partition, reason)` queues it for one partition in the caller's
    transaction and returns what it started (["spark_run:12"])."""

    key: str  # kind:name, e.g. spark:daily_revenue, task:myapp.build_events
    dataset: str
    start: Callable[[str, str], list[str]]
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

        def start(partition: str, reason: str, dataset: str = name) -> list[str]:
            item = engine.enqueue(task, {"dataset": dataset, "partition": partition, "reason": reason})
            return [f"item:{item.id}"]

        made.append(Producer(f"task:{task}", name, start, origin=f"producer_task({task!r})"))
        _tasks[task, name] = made[-1]
    return made


def forget_task(task: str) -> None:
    for key in [k for k in _tasks if k[0] == task]:
        del _tasks[key]


def producers_of(dataset: str) -> list[Producer]:
    """Every producer of `dataset`, by key."""
    found = {p.key: p for p in _tasks.values() if p.dataset == dataset}
    for source in _sources:
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
