"""What a Spark job, a script or a workflow declares of datasets: plain values, the declarations' vocabulary. The
core keeps them (spark/registry.py, spark/scripts.py, workflows/definition.py) and imports nothing of the
datasets app; the datasets app (queue_app/datasets/) reads them: it checks the names and parameters against the
declared datasets (system checks, registered on `problems` in its ready()), parses a trigger upstream's mapping
(datasets/mappings.py: kept here as declared) and runs the triggers, producers and lineage.

    produces=["rollup"]                         # unpartitioned: the whole dataset
    produces={"daily_revenue": "day"}           # the job's `day` parameter names the partition
    consumes=["events", ("regions", "region")]  # a list may mix names and (name, param) pairs
    produces={"sales": "day|region"}            # a multi-dimension dataset: one parameter per dimension, in order
    on_update={"events": ("day", TimeWindow(last=7))}  # a trigger's upstream may carry a mapping (mappings.py)

Shapes are checked when a job is declared (DatasetError); what needs the declarations, by the datasets app's
system checks. Without the datasets app installed, a declaration naming datasets is the system check
jobsite.E113 (spark/checks.py, workflows/checks.py), and a stored script naming some is refused when saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .hooks import Hook

SEPARATOR = "|"  # between the parameters of a multi-dimension partition (datasets/partitions.py's key separator)
MODES = ("all", "any")
MAX_DEBOUNCE = 7 * 86400.0
NO_READER = (
    "it names datasets, but the datasets app is not installed: "
    'INSTALLED_APPS += ["queue_app.datasets"] (docs/how-to/adopt.md), or declare no datasets'
)


class DatasetError(ValueError):
    """A bad dataset declaration, an unknown dataset or a partition that does not fit; the message says why."""


@dataclass(frozen=True)
class DatasetRef:
    name: str
    param: str | None = None  # the job parameter whose value is the partition ("day|region": one per dimension)
    # On a trigger's upstream: which of its partitions a consumer partition reads, as declared (None: the same
    # partition; a mapping object or its JSON form, which the datasets app parses: datasets/mappings.py).
    mapping: Any = field(default=None, hash=False)  # its JSON form (a dict) hashes not

    @property
    def params(self) -> list[str]:
        return self.param.split(SEPARATOR) if self.param else []


def partition_params(param: str | None, key: str) -> dict[str, str]:
    """The parameters a partition `key` gives a job whose `param` takes it: {param: key}, or one per dimension
    ("day|region" takes "2026-11-30|eu": {"day": "2026-11-30", "region": "eu"}); {} without either. The one
    reading of a partition parameter: a trigger's consumers, a producer's start, a backfill."""
    if not param or not key:
        return {}
    names = param.split(SEPARATOR)
    if len(names) == 1:
        return {param: key}
    return dict(zip(names, key.split(SEPARATOR), strict=False))


@dataclass(frozen=True)
class OnUpdate:
    """A consumer's trigger: the upstream datasets (each with the consumer's parameter taking the partition, or
    None), `all` or `any` per partition, and a debounce window in seconds (0: none)."""

    upstreams: tuple[DatasetRef, ...]
    mode: str = "all"
    debounce: float = 0.0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(ref.name for ref in self.upstreams)


# What the datasets app finds wrong with a job's references: f(refs, declared params, *, produced) -> [problem].
problems: Hook[Callable[..., list[str]]] = Hook("dataset ref problems")


def ref_problems(refs: Iterable[DatasetRef], params: Iterable[str], *, produced: bool) -> list[str]:
    """What is wrong with `refs` of a job declaring `params` (the datasets app says; NO_READER without it)."""
    refs, params = list(refs), list(params)
    if not refs:
        return []
    if not problems:
        return [NO_READER]
    return [found for check in problems for found in check(refs, params, produced=produced)]


def unread(declarers: Iterable[tuple[str, bool]]) -> list[Any]:
    """jobsite.E113 for each (what, names datasets) that names datasets while no app reads them (the datasets
    app not installed): the system checks of Spark jobs and workflows."""
    if problems:
        return []
    from django.core import checks

    return [checks.Error(f"{what}: {NO_READER}", obj=what, id="jobsite.E113") for what, names in declarers if names]


def is_mapping(value: Any) -> bool:
    """A partition mapping object (datasets/mappings.py): it says which upstream partitions a partition reads."""
    return callable(getattr(value, "upstream_keys", None))


def dataset_refs(value: Any, *, what: str) -> tuple[DatasetRef, ...]:
    """References from a list of names and (name, param) pairs, or a mapping {name: param or None}."""
    if value is None:
        return ()
    if isinstance(value, str):
        raise DatasetError(f"{what} is a list of dataset names or a mapping {{name: param}}, not a string")
    if isinstance(value, Mapping):
        triples = [(name, *_value(v)) for name, v in value.items()]
    else:
        triples = [_pair(v, what) for v in _items(value, what)]
    refs = []
    for name, param, mapping in triples:
        if not isinstance(name, str) or not name or (param is not None and not isinstance(param, str)):
            raise DatasetError(f"{what}: {name!r}: a dataset name and a parameter name (or None)")
        refs.append(DatasetRef(name, param or None, mapping))
    names = [r.name for r in refs]
    if len(names) != len(set(names)):
        raise DatasetError(f"{what} names a dataset twice: {names}")
    return tuple(refs)


def _items(value: Any, what: str) -> list[Any]:
    if not isinstance(value, Iterable):
        raise DatasetError(f"{what} is a list of dataset names or a mapping {{name: param}}")
    return list(value)


def _value(value: Any) -> tuple[Any, Any]:
    """(param, mapping) of a mapping's value: a param, None, a mapping, (param, mapping) or {"param", "mapping"}."""
    if is_mapping(value):
        return None, value
    if isinstance(value, list | tuple) and len(value) == 2:
        return value[0], value[1]
    if isinstance(value, dict) and set(value) <= {"param", "mapping"}:
        return value.get("param"), value.get("mapping")
    return value, None


def _pair(item: Any, what: str) -> tuple[Any, Any, Any]:
    if isinstance(item, DatasetRef):
        return item.name, item.param, item.mapping
    if isinstance(item, str):
        return item, None, None
    if isinstance(item, list | tuple) and len(item) in (2, 3):
        return item[0], item[1], item[2] if len(item) == 3 else None
    raise DatasetError(f"{what}: {item!r} is neither a dataset name nor a (name, param[, mapping]) tuple")


def on_update_of(value: Any, *, mode: Any = "all", debounce: Any = 0, what: str) -> OnUpdate | None:
    """An OnUpdate from `on_update=` (a list of names or (name, param) pairs, or {name: param}); None for none.
    DatasetError on a bad shape, mode or debounce (when the consumer is declared)."""
    refs = dataset_refs(value, what=f"{what}: on_update")
    if not refs:
        if value is not None:
            raise DatasetError(f"{what}: on_update names no dataset")
        return None
    if mode not in MODES:
        raise DatasetError(f"{what}: trigger mode is 'all' or 'any', got {mode!r}")
    if isinstance(debounce, bool) or not isinstance(debounce, int | float) or not 0 <= debounce <= MAX_DEBOUNCE:
        raise DatasetError(f"{what}: debounce is a number of seconds from 0 to {MAX_DEBOUNCE:g}, got {debounce!r}")
    return OnUpdate(refs, mode, float(debounce))
