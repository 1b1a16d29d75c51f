"""The parameters a dataset's producer is started with for one partition, from three places, the later winning:

1. the partition key, in the producer's partition parameter (a Spark job's `produces={"daily": "day"}`);
2. the dataset's declaration, `params=`: a mapping of templates, or a function of the partition's key

       dataset("rollup", location="rollup/event_date={partition}", partitioning="daily",
               params={"input_dir": "{root}/events/{partition}", "output_dir": "{root}/rollup"})
       dataset("rollup", ..., params=lambda key: {"input_dir": f"/data/events/{key}"})

   A template may name `{partition}` (the key), `{root}` (the first dataset root) and `{location}` (the
   partition's own resolved path; a table location gives its `schema.name`); anything else is refused when the
   dataset is declared. The settings' declarations (JSON) take the mapping form only.
3. what the person gives: `dataset materialize --param NAME=VALUE` (repeatable), the admin's Materialize form.

The values are handed to the producer as they are (strings from a template or the command line): a Spark job's
declared parameters convert and check them when the run is triggered, so a bad one is refused with nothing queued.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..dataset_refs import partition_params
from .locations import dataset_roots

PLACEHOLDERS = ("partition", "root", "location")


def params_of(value: Any) -> Mapping[str, str] | Callable[[str], Mapping[str, Any]] | None:
    """A declaration's `params`, checked: None, a callable, or {name: template}; ValueError saying why not."""
    if value is None or callable(value):
        return value
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value):
        raise ValueError("a mapping of parameter names to templates, or a function of the partition's key")
    for name, template in value.items():
        if not isinstance(template, str):
            raise ValueError(f"{name!r}: a template is a string, got {type(template).__name__}")
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
        except ValueError as exc:
            raise ValueError(f"{name!r}: {exc}") from None
        if unknown := [f for f in fields if f not in PLACEHOLDERS]:
            known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise ValueError(f"{name!r}: unknown placeholder {{{unknown[0]}}} (known: {known})")
    return dict(value)


def declared_params(dataset: Any, key: str) -> dict[str, Any]:
    """The declaration's parameters for partition `key` of `dataset` (a Dataset); {} when it declares none."""
    declared = dataset.params
    if declared is None:
        return {}
    if callable(declared):
        made = declared(key)
        if not isinstance(made, Mapping) or not all(isinstance(k, str) for k in made):
            raise ValueError(
                f"dataset {dataset.name!r}: its params function returned {type(made).__name__}, not a mapping"
            )
        return dict(made)
    location = dataset.location
    values = {
        "partition": key,
        "root": dataset_roots()[0],
        "location": location.table if location.table else location.resolve(key),
    }
    return {name: template.format(**values) for name, template in declared.items()}


def parse_pairs(pairs: Iterable[str], *, option: str = "--param") -> dict[str, str]:
    """{"NAME": "VALUE"} from ["NAME=VALUE", ...]; ValueError naming the first bad pair (no '=', no name, a name
    given twice)."""
    found: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{option} takes NAME=VALUE, not {pair!r}")
        if name in found:
            raise ValueError(f"{option} {name} is given twice")
        found[name] = value
    return found


def producer_params(
    dataset: Any, key: str, partition_param: str | None, given: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The parameters of one start of `dataset`'s producer for `key`: the partition parameter, then the
    declaration's, then `given` (see the module)."""
    params: dict[str, Any] = partition_params(partition_param, key)  # one per dimension for "day|region"
    params.update(declared_params(dataset, key))
    params.update(given or {})
    return params
