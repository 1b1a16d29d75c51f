"""Data-aware triggers: a consumer (a Spark job, a task) runs for a partition when its upstream datasets' partition
is materialized, exactly once per set of upstream materializations, decided in the transaction that records the
last of them. No polling coordinator: the decision rides on the recorder's transaction.

    @spark_job("daily_report", params=[Param("day", "date", required=True)],
               on_update=["events", "regions"], trigger_mode="all", debounce=60)

    trigger_task("myapp.refresh", on_update={"events": None}, mode="any")   # a task item per update

The entry point is materialization_usable(materialization), called in the transaction that makes a
materialization usable (datasets/checks_run.py): its record when it has no blocking checks, else when its last
blocking check passes or its failures are overridden. For each
consumer of the materialization's dataset, in consumer order (so concurrent recorders lock in one order):

1. TRIGGER_LOCK_MANY upserts and locks the (consumer, partition) state rows (one; with a mapping, every consumer
   partition the upstream partition feeds, in key order, in one statement): a concurrent recorder of another upstream
   of the same partition waits for this transaction, then reads what it committed (READ COMMITTED reads the
   conflicting row's newest version), so of two upstreams recorded at once the second committer sees both.
2. The materialization joins `pending` ({dataset: id} since the consumer's last run); one already counted
   (`seen`, the newest id per upstream) is ignored, so a materialization reported twice counts once.
3. `all`: ready when every upstream is pending; `any`: ready at once. Ready and not debounced: `pending` is
   cleared and the fire inserted in one statement (TRIGGER_SAVE_AND_FIRE; the fire is unique on consumer,
   partition and the SHA-256 of the upstream ids): only a fire that inserts starts the consumer (all or nothing:
   a consumer that cannot start is written on the fire as its error, and the recorder's transaction commits).
4. Debounced (`debounce=SECONDS`): `due_at` is set (pushed back by every later update) and one delayed item of
   `queue_app.dataset_trigger_due` (tasks.py) is kept per pair; when it runs (due_timer) it fires the pending set
   if `due_at` has passed, or queues itself again at `due_at`. So several updates inside the window make one run.

Mappings (mappings.py) on an upstream (`on_update={"events": ("day", TimeWindow(last=7))}`): an upstream
materialization of partition u moves the state rows of every consumer partition its mapping feeds
(downstream_keys), locked in key order; it joins `pending` as "events[u]" (an identity upstream keeps the plain
name, so the rows of one-dimension consumers read as before), and `all` is ready when every partition the
mapping names for the consumer's partition (upstream_keys) is pending, the one recorded last deciding in its
transaction, as for several upstreams. A mapping that names no partition (a fan-in over an empty dynamic set)
is never ready.

A run that fails records no materialization and so triggers nothing. Consumers come from sources (add_source):
the Spark jobs' (spark_triggers.py), the workflows' (workflow_triggers.py) and the tasks registered here
(trigger_task).
"""

from __future__ import annotations

import graphlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core import checks

from queue_app import engine

from ..dataset_refs import DatasetRef, OnUpdate, on_update_of, partition_params
from ..engine.alias import atomic, connection
from .declarations import DatasetError, get_dataset
from .mappings import IDENTITY, mapping_of
from .mappings import Mapping as PartitionMapping
from .partitions import PartitionError, Partitioning
from .refs import dimension_problem
from .sql import (
    TIMER_ALIVE,
    TRIGGER_CLEAR,
    TRIGGER_FIRED,
    TRIGGER_LOCK_MANY,
    TRIGGER_SAVE,
    TRIGGER_SAVE_AND_FIRE,
    TRIGGER_SAVE_MANY,
    TRIGGER_TIMER,
    TRIGGER_TIMER_SET,
)

logger = logging.getLogger("jobsite.datasets")

TIMER_TASK = "queue_app.dataset_trigger_due"


def mapping(ref: DatasetRef) -> PartitionMapping:
    """The upstream's mapping, parsed from its declaration (None: identity; PartitionError: one that does not
    parse, which the system check jobsite.E108 reports)."""
    return mapping_of(ref.mapping)


@dataclass(frozen=True)
class Consumer:
    """Something a dataset update starts. `start(partition, upstream)` starts it for a partition inside the
    recorder's transaction and returns what it started (["spark_run:12"]); `param` is its parameter taking the
    partition (None: it takes none); `produces` the datasets it writes (for the cycle check)."""

    key: str  # kind:name
    trigger: OnUpdate
    start: Callable[[str, Mapping[str, int]], list[str]]
    param: str | None = None
    params: tuple[str, ...] = ()  # its declared parameters (for the checks)
    produces: tuple[str, ...] = ()
    origin: str = ""
    atomic_start: bool = False  # start() keeps its writes all-or-nothing itself (else it runs in a savepoint)


_sources: list[Callable[[], Iterable[Consumer]]] = []
_tasks: dict[str, Consumer] = {}


def add_source(source: Callable[[], Iterable[Consumer]]) -> None:
    """Register a function listing consumers (called on every lookup: keep it free of database reads)."""
    if source not in _sources:
        _sources.append(source)


def consumers() -> dict[str, Consumer]:
    found = dict(_tasks)
    for source in _sources:
        for consumer in source():
            found.setdefault(consumer.key, consumer)
    return dict(sorted(found.items()))


def get_consumer(key: str) -> Consumer | None:
    return consumers().get(key)


def trigger_task(
    task: str, *, on_update: Any, mode: str = "all", debounce: float = 0, produces: Iterable[str] = ()
) -> Consumer:
    """Make the task `task` a consumer: each fire enqueues one item with payload {"partition", "upstream":
    {dataset: materialization id}}. Registering the same task again replaces it."""
    trigger = on_update_of(on_update, mode=mode, debounce=debounce, what=f"task {task!r}")
    if trigger is None:
        raise DatasetError(f"task {task!r}: on_update names no dataset")

    def start(partition: str, upstream: Mapping[str, int]) -> list[str]:
        item = engine.enqueue(task, {"partition": partition, "upstream": dict(upstream)})
        return [f"item:{item.id}"]

    consumer = Consumer(f"task:{task}", trigger, start, produces=tuple(produces), origin=f"trigger_task({task!r})")
    _tasks[consumer.key] = consumer
    return consumer


def forget_task(task: str) -> None:
    _tasks.pop(f"task:{task}", None)


# -- consumers declared on a job: a Spark job's or a workflow's on_update= (spark_triggers.py, workflow_triggers.py)


def partition_param(trigger: OnUpdate, refs: Iterable[DatasetRef] = ()) -> str | None:
    """The job's parameter taking its partition: the first on_update upstream naming one, else the first of
    `refs` (what it produces or consumes) naming one for a partitioned dataset; None: it takes none."""
    for ref in trigger.upstreams:
        if ref.param:
            return ref.param
    for ref in refs:
        try:
            partitioned = get_dataset(ref.name).partitioning.describe() is not None
        except DatasetError:
            continue
        if ref.param and partitioned:
            return ref.param
    return None


def declared_consumer(
    kind: str,
    name: str,
    trigger: OnUpdate,
    start: Callable[[str, dict[str, str], str], str],
    *,
    params: Iterable[str] = (),
    refs: Iterable[DatasetRef] = (),
    produces: Iterable[str] = (),
    origin: str = "",
    atomic_start: bool = False,
) -> Consumer:
    """The consumer `kind:name` of a job declared with on_update=: a fire checks the partition against the
    consumer's partitioning in the recorder's transaction (a dynamic key's row held FOR SHARE, so a removal of the
    key waits for the start and then sees it: dynamic.py), then calls `start(name, params, requested_by)` with the
    job's partition parameter set from the key (one per dimension for "day|region": dataset_refs.partition_params)
    and "events #12, regions #13"; it returns what it started ("workflow:12")."""
    param = partition_param(trigger, refs)
    made: list[Consumer] = []

    def start_for(partition: str, upstream: Mapping[str, int]) -> list[str]:
        checked_partition(made[0], partition)
        requested_by = ", ".join(f"{ds} #{mid}" for ds, mid in sorted(upstream.items()))
        return [start(name, partition_params(param, partition), requested_by)]

    made.append(
        Consumer(
            key=f"{kind}:{name}",
            trigger=trigger,
            start=start_for,
            param=param,
            params=tuple(params),
            produces=tuple(produces),
            origin=origin,
            atomic_start=atomic_start,
        )
    )
    return made[0]


def checked_partition(consumer: Consumer, partition: str) -> str:
    """`partition` as a key of the consumer's partitioning (a dynamic key read FOR SHARE in the caller's
    transaction); DatasetError when it is none."""
    part = consumer_partitioning(consumer)
    if part is None or not partition:
        return partition
    try:
        return part.key(partition)
    except PartitionError as exc:
        raise DatasetError(f"{consumer.key}: {partition!r} is not a partition: {exc}") from None


def _loads(value: Any) -> dict[str, int]:
    """A jsonb column as Django's cursor returns it (text: Django leaves JSON undecoded)."""
    return json.loads(value) if isinstance(value, str | bytes) else dict(value or {})


def fingerprint(upstream: Mapping[str, int]) -> str:
    return hashlib.sha256(json.dumps(sorted(upstream.items()), separators=(",", ":")).encode()).hexdigest()


@dataclass
class Fired:
    consumer: str
    partition: str
    upstream: dict[str, int]
    started: list[str] = field(default_factory=list)
    error: str = ""


def materialization_usable(materialization: Any) -> list[Fired]:
    """`materialization` (a Materialization: dataset, partition, id) is usable by its consumers: move their
    triggers, in the caller's transaction. Returns the fires it made (debounced ones fire later)."""
    wanting = [c for c in consumers().values() if materialization.dataset in c.trigger.names]
    fired = []
    for consumer in wanting:  # in key order, and each one's partitions in key order: one lock order for all
        ref = next(r for r in consumer.trigger.upstreams if r.name == materialization.dataset)
        partitions = _fed(consumer, ref, materialization.partition)
        if partitions:
            fired += _update(consumer, ref, partitions, materialization.partition, int(materialization.id))
    return fired


def consumer_partitioning(consumer: Consumer) -> Partitioning | None:
    """The consumer's partitioning: its produced partitioned dataset's, else what its upstreams' mappings imply
    (an identity upstream: its own). None when nothing says (a system check reports it)."""
    for name in consumer.produces:
        try:
            part = get_dataset(name).partitioning
        except DatasetError:
            continue
        if part.describe() is not None:
            return part
    for ref in consumer.trigger.upstreams:
        try:
            implied = mapping(ref).target(get_dataset(ref.name).partitioning)
        except (DatasetError, PartitionError):
            continue
        if implied is not None:
            return implied
    return None


def _fed(consumer: Consumer, ref: DatasetRef, key: str) -> list[str]:
    """The consumer partitions an upstream partition `key` feeds, in key order."""
    try:
        if mapping(ref) == IDENTITY:
            return [key]
        down = consumer_partitioning(consumer)
        if down is None:
            return []
        return sorted(set(mapping(ref).downstream_keys(get_dataset(ref.name).partitioning, down, key)))
    except (DatasetError, PartitionError) as exc:
        logger.error("dataset trigger %s: %s[%s] maps to no partition: %s", consumer.key, ref.name, key, exc)
        return []


def slot(ref: DatasetRef, key: str) -> str:
    """An upstream partition's name in a state row's pending and seen sets."""
    return ref.name if mapping(ref) == IDENTITY else f"{ref.name}[{key}]"


def needed(consumer: Consumer, partition: str) -> list[str] | None:
    """Every slot the consumer's partition waits for in `all` mode; None when a mapping names none."""
    wanted = []
    down = None
    for ref in consumer.trigger.upstreams:
        try:
            identity = mapping(ref) == IDENTITY
        except PartitionError:
            return None
        if identity:
            wanted.append(ref.name)
            continue
        down = down or consumer_partitioning(consumer)
        try:
            keys = mapping(ref).upstream_keys(get_dataset(ref.name).partitioning, down, partition)  # type: ignore[arg-type]
        except (DatasetError, PartitionError):
            keys = []
        if not keys:
            return None
        wanted += [slot(ref, k) for k in keys]
    return wanted


def _update(consumer: Consumer, ref: DatasetRef, partitions: list[str], key: str, materialization_id: int) -> list:
    """Move the consumer's state rows of `partitions` (sorted) for the upstream partition `key`: all locked in one
    statement, those not ready written back in one more, each ready one fired (or its debounce timer set)."""
    trigger = consumer.trigger
    name = slot(ref, key)
    ready_rows, saves = [], []
    with connection.cursor() as cursor:
        cursor.execute(TRIGGER_LOCK_MANY, [consumer.key, partitions])
        rows = {row[1]: row for row in cursor.fetchall()}
        for partition in partitions:
            state_id, _partition, pending, seen, timer_item_id = rows[partition]
            pending, seen = _loads(pending), _loads(seen)
            if seen.get(name, 0) >= materialization_id:
                continue  # counted already (reported twice, or an older one reported late)
            seen[name] = pending[name] = materialization_id
            if trigger.mode == "any":
                ready = True
            else:
                wanted = needed(consumer, partition)
                ready = wanted is not None and all(n in pending for n in wanted)
            if ready:
                ready_rows.append((state_id, partition, pending, seen, timer_item_id))
            else:
                saves.append({"id": state_id, "pending": pending, "seen": seen})
        if saves:
            cursor.execute(TRIGGER_SAVE_MANY, [json.dumps(saves)])
    fired = []
    for state_id, partition, pending, seen, timer_item_id in ready_rows:
        if trigger.debounce > 0:
            _debounce(consumer, partition, state_id, pending, seen, timer_item_id)
            continue
        done = _fire(consumer, partition, dict(pending), saving=(json.dumps(seen), state_id))
        if done is not None:
            fired.append(done)
    return fired


def _debounce(consumer: Consumer, partition: str, state_id: int, pending: dict, seen: dict, timer_item_id: Any) -> None:
    """A ready pair under debounce: `due_at` set (pushed back by every later update) and one delayed item kept."""
    with connection.cursor() as cursor:
        if timer_item_id is not None:
            cursor.execute(TIMER_ALIVE, [timer_item_id])
            timer_item_id = timer_item_id if cursor.fetchone()[0] else None
        debounce = consumer.trigger.debounce
        cursor.execute(
            TRIGGER_SAVE, [json.dumps(pending), json.dumps(seen), debounce, debounce, timer_item_id, state_id]
        )
        (due_at,) = cursor.fetchone()
        if timer_item_id is None:  # the one delayed item of the pair; later updates only push due_at back
            item = engine.enqueue(TIMER_TASK, {"consumer": consumer.key, "partition": partition}, run_at=due_at)
            cursor.execute(TRIGGER_TIMER_SET, [item.id, state_id])


def _fire(consumer: Consumer, partition: str, upstream: dict[str, int], saving: tuple[str, int]) -> Fired | None:
    """Clear the state row's pending set (`saving`: its seen ids and id), insert the fire of this upstream set
    and, when it is new, start the consumer (in a savepoint unless it keeps its own writes atomic)."""
    with connection.cursor() as cursor:
        cursor.execute(
            TRIGGER_SAVE_AND_FIRE, [*saving, consumer.key, partition, fingerprint(upstream), json.dumps(upstream)]
        )
        row = cursor.fetchone()
        if row is None:
            return None  # this set started it already
        fired = Fired(consumer.key, partition, upstream)
        try:
            if consumer.atomic_start:
                fired.started = list(consumer.start(partition, upstream))
            else:
                with atomic():
                    fired.started = list(consumer.start(partition, upstream))
        except Exception as exc:  # noqa: BLE001 - the producer's success must commit; the fire keeps the error
            fired.error = f"{type(exc).__name__}: {exc}"[:2000]
            logger.error("dataset trigger %s[%s] could not start: %s", consumer.key, partition, fired.error)
        cursor.execute(TRIGGER_FIRED, [json.dumps(fired.started), fired.error, row[0]])
    logger.info("dataset trigger %s[%s] fired by %s: %s", consumer.key, partition, upstream, fired.started)
    return fired


def due_timer(consumer_key: str, partition: str, item_id: int) -> Fired | str | None:
    """A debounce timer's item `item_id` came due: in one transaction, fire the pending set if the window has
    passed, queue the timer again at `due_at` if updates pushed it back, or do nothing if the item is not the
    pair's current timer (a re-delivery, or one replaced)."""
    with atomic(), connection.cursor() as cursor:
        cursor.execute(TRIGGER_TIMER, [consumer_key, partition])
        row = cursor.fetchone()
        if row is None or row[4] != item_id:
            return "stale"
        state_id, pending, seen, due_at, _timer, later = row
        pending, seen = _loads(pending), json.dumps(_loads(seen))
        if later:
            item = engine.enqueue(TIMER_TASK, {"consumer": consumer_key, "partition": partition}, run_at=due_at)
            cursor.execute(TRIGGER_TIMER_SET, [item.id, state_id])
            return "pushed back"
        consumer = get_consumer(consumer_key)
        if consumer is None or not pending:
            cursor.execute(TRIGGER_CLEAR, [state_id])
            logger.warning("dataset trigger %s is no longer declared: pending %s dropped", consumer_key, pending)
            return None
        return _fire(consumer, partition, dict(pending), saving=(seen, state_id))


# -- system checks ---------------------------------------------------------------------------------------------


def trigger_problems(all_consumers: Mapping[str, Consumer]) -> list[tuple[str, str]]:
    """[(check id, message)]: a consumer of an unknown dataset (E107), upstreams whose partitions do not fit the
    consumer (E108: partitioned differently, or no parameter to take a partition), a trigger cycle (E109)."""
    problems, graph = [], {}
    for consumer in all_consumers.values():
        partitionings = set()
        down = consumer_partitioning(consumer)
        for ref in consumer.trigger.upstreams:
            try:
                ds = get_dataset(ref.name)
            except DatasetError as exc:
                problems.append(("jobsite.E107", f"{consumer.key} on_update: {exc}"))
                continue
            try:
                upstream_mapping = mapping(ref)
            except PartitionError as exc:
                problems.append(("jobsite.E108", f"{consumer.key} on_update: {ref.name!r}: {exc}"))
                continue
            if upstream_mapping == IDENTITY:
                partitionings.add(repr(ds.partitioning.describe()))
            elif down is None:
                problems.append(
                    (
                        "jobsite.E108",
                        f"{consumer.key} on_update: {ref.name!r} has a {upstream_mapping.label} mapping but "
                        "nothing says how the consumer is partitioned (produce a partitioned dataset)",
                    )
                )
            else:
                partitionings.add(repr(down.describe()))
                problems += [
                    ("jobsite.E108", f"{consumer.key} on_update: {ref.name!r}: {p}")
                    for p in upstream_mapping.problems(ds.partitioning, down)
                ]
        if len(partitionings) > 1:
            problems.append(
                (
                    "jobsite.E108",
                    f"{consumer.key} on_update: its upstreams are partitioned differently ({sorted(partitionings)}): "
                    "a partition of one is not a partition of the others",
                )
            )
        elif partitionings and partitionings != {"None"}:
            if consumer.param is None and consumer.key.startswith(("spark:", "workflow:")):
                problems.append(
                    (
                        "jobsite.E108",
                        f"{consumer.key} on_update: its upstreams are partitioned but it has no parameter to take "
                        "the partition (name it: on_update={'dataset': 'param'})",
                    )
                )
            elif (
                consumer.param is not None
                and consumer.params
                and not set(consumer.param.split("|")) <= set(consumer.params)
            ):
                problems.append(
                    ("jobsite.E108", f"{consumer.key} on_update: {consumer.param!r} is not a declared parameter")
                )
            elif split := dimension_problem(consumer.param, down):
                problems.append(("jobsite.E108", f"{consumer.key} on_update: {split}"))
        for upstream in consumer.trigger.names:
            graph.setdefault(upstream, set())
            for produced in consumer.produces:
                graph.setdefault(produced, set()).add(upstream)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle = " -> ".join(reversed(exc.args[1]))
        problems.append(("jobsite.E109", f"data-aware triggers form a cycle: {cycle}"))
    return problems


@checks.register("jobsite")
def trigger_checks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobsite.E107-E109 over every consumer."""
    return [checks.Error(message, id=check_id) for check_id, message in trigger_problems(consumers())]
