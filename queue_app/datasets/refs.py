"""The datasets' reading of what a job produces and consumes: the references themselves (DatasetRef,
dataset_refs) are the core's vocabulary (queue_app/dataset_refs.py, re-exported here), plain values a Spark job,
script or workflow keeps; this module checks them against the declared datasets and turns a run's parameters
into partition keys.

A job that produces a partitioned dataset must name the parameter; one that consumes it may leave it out (it
reads every partition). Shapes are checked when a job is declared (DatasetError); what needs the declarations
(an unknown dataset, a parameter the job does not declare, a trigger upstream's mapping that does not parse)
by the system check jobsite.E106 (ref_problems, registered on the core's dataset_refs.problems), and a
partition that does not fit when a run is triggered (partition_keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..dataset_refs import DatasetRef, dataset_refs
from .declarations import DatasetError, get_dataset
from .mappings import mapping_of
from .partitions import MultiPartitions, PartitionError, Partitioning

__all__ = ["DatasetRef", "PartitionParamError", "dataset_refs", "partition_keys", "ref_problems"]


class PartitionParamError(DatasetError):
    """A run's parameter that does not name a partition of a dataset it produces; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(f"{param}: {message}")
        self.message = message


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
        try:
            mapping_of(ref.mapping)
        except PartitionError as exc:
            problems.append(f"dataset {ref.name!r}: {exc}")
        partitioned = ds.partitioning.describe() is not None
        undeclared = [p for p in ref.params if p not in declared]
        if undeclared:
            problems.append(
                f"dataset {ref.name!r}: the partition parameter {undeclared[0]!r} is not a declared parameter"
            )
        elif split := dimension_problem(ref.param, ds.partitioning):
            problems.append(f"dataset {ref.name!r}: {split}")
        elif ref.param is not None and not partitioned:
            problems.append(f"dataset {ref.name!r} is not partitioned: it takes no partition parameter")
        elif ref.param is None and partitioned and produced:
            problems.append(f"dataset {ref.name!r} is partitioned: say which parameter names the partition")
    return problems


def dimension_problem(param: str | None, partitioning: Partitioning | None) -> str | None:
    """What is wrong with a partition parameter naming one parameter per dimension ("day|region") for
    `partitioning`: not as many as its dimensions (a parameter without "|" takes the whole key: never wrong)."""
    names = param.split("|") if param else []
    if len(names) < 2 or (isinstance(partitioning, MultiPartitions) and len(names) == len(partitioning.names)):
        return None
    return (
        f"{param!r} names {len(names)} parameters; give one per dimension ({partitioning!r}) or one taking the "
        "whole key"
    )


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
