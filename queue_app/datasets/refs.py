"""What a job produces and consumes: references to declared datasets, each with the job parameter whose value
names the partition (for a partitioned dataset).

    produces=["rollup"]                         # unpartitioned: the whole dataset
    produces={"daily_revenue": "day"}           # the job's `day` parameter names the partition
    consumes=["events", ("regions", "region")]  # a list may mix names and (name, param) pairs
    produces={"sales": "day|region"}            # a multi-dimension dataset: one parameter per dimension, in order
    on_update={"events": ("day", TimeWindow(last=7))}  # a trigger's upstream may carry a mapping (mappings.py)

A job that produces a partitioned dataset must name the parameter; one that consumes it may leave it out (it
reads every partition). Shapes are checked when a job is declared (DatasetError); what needs the declarations
(an unknown dataset, a parameter the job does not declare) by the system check jobsite.E106, and a partition
that does not fit when a run is triggered (partition_keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .declarations import DatasetError, get_dataset
from .mappings import IDENTITY, mapping_of
from .mappings import Mapping as PartitionMapping
from .partitions import SEPARATOR, MultiPartitions, PartitionError


class PartitionParamError(DatasetError):
    """A run's parameter that does not name a partition of a dataset it produces; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(f"{param}: {message}")
        self.message = message


@dataclass(frozen=True)
class DatasetRef:
    name: str
    param: str | None = None  # the job parameter whose value is the partition ("day|region": one per dimension)
    mapping: PartitionMapping = IDENTITY  # on a trigger's upstream: which of its partitions a consumer partition reads

    @property
    def params(self) -> list[str]:
        return self.param.split(SEPARATOR) if self.param else []


def dataset_refs(value: Any, *, what: str) -> tuple[DatasetRef, ...]:
    """References from a list of names and (name, param) pairs, or a mapping {name: param or None}."""
    if value is None:
        return ()
    if isinstance(value, str):
        raise DatasetError(f"{what} is a list of dataset names or a mapping {{name: param}}, not a string")
    if isinstance(value, Mapping):
        triples = [(name, *_value(v, what)) for name, v in value.items()]
    else:
        triples = [_pair(v, what) for v in _items(value, what)]
    refs = []
    for name, param, mapping in triples:
        if not isinstance(name, str) or not name or (param is not None and not isinstance(param, str)):
            raise DatasetError(f"{what}: {name!r}: a dataset name and a parameter name (or None)")
        try:
            refs.append(DatasetRef(name, param or None, mapping_of(mapping)))
        except PartitionError as exc:
            raise DatasetError(f"{what}: {name!r}: {exc}") from None
    names = [r.name for r in refs]
    if len(names) != len(set(names)):
        raise DatasetError(f"{what} names a dataset twice: {names}")
    return tuple(refs)


def _items(value: Any, what: str) -> list[Any]:
    if not isinstance(value, Iterable):
        raise DatasetError(f"{what} is a list of dataset names or a mapping {{name: param}}")
    return list(value)


def _value(value: Any, what: str) -> tuple[Any, Any]:
    """(param, mapping) of a mapping's value: a param, None, a Mapping, (param, mapping) or {"param", "mapping"}."""
    if isinstance(value, PartitionMapping):
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


def ref_problems(refs: Iterable[DatasetRef], params: Iterable[str], *, produced: bool) -> list[str]:
    """What is wrong with `refs` of a job declaring `params`: an unknown dataset, a parameter it does not
    declare, a parameter for an unpartitioned dataset, no parameter for a partitioned one it produces."""
    declared, problems = set(params), []
    for ref in refs:
        try:
            ds = get_dataset(ref.name)
        except DatasetError as exc:
            problems.append(str(exc))
            continue
        partitioned = ds.partitioning.describe() is not None
        undeclared = [p for p in ref.params if p not in declared]
        if undeclared:
            problems.append(
                f"dataset {ref.name!r}: the partition parameter {undeclared[0]!r} is not a declared parameter"
            )
        elif len(ref.params) > 1 and (
            not isinstance(ds.partitioning, MultiPartitions) or len(ref.params) != len(ds.partitioning.names)
        ):
            problems.append(
                f"dataset {ref.name!r}: {ref.param!r} names {len(ref.params)} parameters; give one per dimension "
                f"({ds.partitioning!r}) or one taking the whole key"
            )
        elif ref.param is not None and not partitioned:
            problems.append(f"dataset {ref.name!r} is not partitioned: it takes no partition parameter")
        elif ref.param is None and partitioned and produced:
            problems.append(f"dataset {ref.name!r} is partitioned: say which parameter names the partition")
    return problems


def partition_keys(refs: Iterable[DatasetRef], params: Mapping[str, Any]) -> dict[str, str]:
    """{dataset: canonical partition key} of the partitions `refs` name with the run's (dumped) `params`;
    PartitionParamError naming the parameter that does not fit (DatasetError for an unknown dataset). A consumed
    dataset without a parameter is left out."""
    keys = {}
    for ref in refs:
        ds = get_dataset(ref.name)
        if ref.param is None:
            if ds.partitioning.describe() is None:
                keys[ref.name] = ds.partition_key(None)
            continue
        if len(ref.params) > 1:
            missing = [p for p in ref.params if params.get(p) is None]
            if missing:
                raise PartitionParamError(missing[0], f"no value, and it names a dimension of dataset {ref.name!r}")
            value: Any = [params[p] for p in ref.params]
        else:
            value = params.get(ref.param)
        if value is None:
            raise PartitionParamError(ref.param, f"no value, and it names the partition of dataset {ref.name!r}")
        try:
            keys[ref.name] = ds.partitioning.key(value)
        except PartitionError as exc:
            raise PartitionParamError(
                ref.param, f"{value!r} is not a partition of dataset {ref.name!r}: {exc}"
            ) from None
    return keys
