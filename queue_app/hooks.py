"""The hooks the core publishes for the layer apps (Spark runs, workflows, datasets, webhooks): the core calls them, a
layer registers its functions on them in its AppConfig.ready(). The core names no layer; a project without the layer
installed has nothing registered and the core behaves as if the feature did not exist.

- `held_reasons(item_ids) -> {item id: why}`: why a ready item is held back by a layer (the datasets park an item
  whose input partitions are not usable). The item page, the Spark run page and the workflow pages say it.
- `producer_succeeded(task, payload, result, item_id)`: inside the transaction that settles a successful attempt
  of a task declared with `produces=` (the datasets record the materializations it produced).
- `metric_collectors() -> collector`: a Prometheus collector for /metrics, built inside the request's try (a
  DatabaseError answers 503 like the core's own figures).
- `event_published(event type, data) -> [what it made]`: inside the transaction that publishes an event
  (events.publish: the core's and every layer's events); the webhooks app writes a delivery per subscribed
  endpoint.
- `maintenance_units[name]() -> dict`: a maintenance unit a core task runs by name; the core's shipped schedules
  "dataset-staleness" and "dataset-watch" (its migrations made them) fire `queue_app.dataset_staleness` and
  `queue_app.dataset_watch` (maintenance_tasks.py), which run the unit the datasets app registered, and say
  "skipped" without it.
- `schedule_targets[kind]`: a ScheduleTarget (`fire(schedule) -> item id or None`, in the fire's transaction;
  `problems(target, payload) -> [(field, message, code)]` for the schedule form) for a schedule's target kind
  other than a task: the Spark app registers "spark", the workflows app "workflow". A schedule of a kind no
  installed app registers is refused by the form and fails its fire saying which app to add.
- `prunes[name]() -> int`: what `queue_app.prune` removes besides the queue's own (the Spark app: runs past their
  retention and their event logs), reported under `name`.
- `expired_drops(limit) -> int`: a worker's maintenance round deleting what expired (the workflows app: inbound
  events no wait claimed within their lookback), at most `limit` rows; counted as the worker's events_dropped.
- `cancel_requested(item_ids, actor) -> (asked, kept)`: inside the transaction that cancels queue items
  (services.cancel_items), before the items are locked; a layer whose rows ride on some of the items cancels its
  own rows first (the Spark app: an open run is cancelled with its item, or moved to `cancelling`). `asked`
  counts the cancels it asked of a running handler, `kept` are the items that handler settles itself (the core
  leaves them alone).
- `urls[name]`: a URL pattern of a layer under `include("queue_app.urls")` (the workflows app:
  `/events/<source>/`).
- Tasks: a layer's tasks live in its own `tasks.py`, which the task registry finds in every installed app.

A layer that others build on publishes its own hooks the same way (spark/hooks.py, workflows/hooks.py).

A function registered again (the same module and name: ready() run twice in a test) replaces itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from .registries import origin_of


class Hook[F: Callable[..., Any]]:
    """The functions registered on one hook, in registration order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._functions: dict[str, F] = {}

    def register(self, function: F) -> F:
        self._functions[origin_of(function)] = function
        return function

    def unregister(self, function: F) -> None:
        self._functions.pop(origin_of(function), None)

    def __iter__(self):
        return iter(list(self._functions.values()))

    def __bool__(self) -> bool:
        return bool(self._functions)


held_reasons: Hook[Callable[[list[int]], dict[int, str]]] = Hook("held reasons")
producer_succeeded: Hook[Callable[[Any, Any, Any, int], None]] = Hook("task succeeded")
metric_collectors: Hook[Callable[[], Any]] = Hook("metric collectors")
event_published: Hook[Callable[[str, Any], list[Any]]] = Hook("event published")
maintenance_units: dict[str, Callable[[], dict[str, Any]]] = {}
prunes: dict[str, Callable[[], int]] = {}
expired_drops: Hook[Callable[[int], int]] = Hook("expired drops")
cancel_requested: Hook[Callable[[list[int], str], tuple[int, set[int]]]] = Hook("cancel requested")
urls: dict[str, Any] = {}


class ScheduleTarget(NamedTuple):
    """A schedule target kind a layer runs: `fire(schedule)` queues it in the caller's transaction (the item's id,
    or None when it has none); `problems(target, payload)` says what the schedule form must refuse, as
    (field, message, code)."""

    fire: Callable[[Any], int | None]
    problems: Callable[[str, Any], list[tuple[str, Any, str]]]


schedule_targets: dict[str, ScheduleTarget] = {}


def run_maintenance(name: str) -> dict[str, Any]:
    """What the maintenance unit `name` returns, or why it did not run (no installed app registers it)."""
    unit = maintenance_units.get(name)
    if unit is None:
        return {"skipped": f"no installed app registers the maintenance unit {name!r}"}
    return unit()


def why_held(item_ids: Iterable[int]) -> dict[int, str]:
    """{item id: why it is held} of the given items that a layer holds back ("; " between layers' reasons)."""
    ids = list(item_ids)
    found: dict[int, list[str]] = {}
    if ids:
        for reasons in held_reasons:
            for item_id, reason in reasons(ids).items():
                found.setdefault(item_id, []).append(reason)
    return {item_id: "; ".join(reasons) for item_id, reasons in found.items()}
