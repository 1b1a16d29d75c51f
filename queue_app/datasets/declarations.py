"""Declared datasets: in code next to the jobs that make them, and in settings.

    # an app's datasets.py, or a module the DATASET_MODULES setting names
    from queue_app.datasets import Freshness, StaticPartitions, dataset

    events = dataset("events", location="events/day={partition}", partitioning="daily",
                     owner="data-eng", freshness=Freshness(partition_by="06:00"))

    # settings
    JOBSITE = {"DATASETS": {"events": {"location": "events/day={partition}", "partitioning": "daily",
                                       "freshness": {"partition_by": "06:00"}}}}

Code declarations go through the project's registry shape (registries.py): found in every installed app's
`datasets` module and the DATASET_MODULES setting's modules. A name declared in both code and settings takes the
settings declaration (an operator moves a dataset per deployment) and must keep the code's partitioning: the
system check jobsite.E101 says so otherwise. The name, location and partitioning shape are checked when a dataset
is declared (DatasetError); what depends on the machine (the roots), the static keys and the freshness policy are
checked by the system checks (checks.py), so a declaration never stops Django from starting.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from queue_app.conf import queue_settings
from queue_app.dataset_refs import DatasetError  # the declarations' error, the core's vocabulary (re-exported)
from queue_app.registries import Registry

from .freshness import Freshness, freshness_of
from .locations import Location, LocationError, location_of
from .partitions import PartitionError, Partitioning, partitioning_of
from .producer_params import params_of

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
SETTINGS_KEYS = {
    "location",
    "partitioning",
    "owner",
    "description",
    "freshness",
    "trigger_producer_when_stale",
    "params",
}


@dataclass(frozen=True)
class Dataset:
    name: str
    location: Location
    partitioning: Partitioning
    owner: str = ""
    description: str = ""
    freshness: Freshness | None = None
    trigger_producer_when_stale: bool = False  # a stale episode starts its producer (producers.py, stale.py)
    declared_in: str = "code"  # code or settings (the admin's, next, as rows)
    origin: str = ""  # who declared it: module:line for code, the setting for settings
    # What its producer needs besides the partition (producer_params.py): {name: template} or a function of the key
    params: Any = None

    def partition_key(self, value: Any = None) -> str:
        """The canonical key of `value` in this dataset's partitioning; DatasetError naming the dataset."""
        try:
            return self.partitioning.key(value)
        except PartitionError as exc:
            raise DatasetError(f"dataset {self.name!r}: {exc}") from None

    def config(self) -> dict[str, Any]:
        """The declaration as JSON: what a Dataset row snapshots."""
        return {
            "location": self.location.text,
            "partitioning": self.partitioning.describe(),
            "owner": self.owner,
            "description": self.description,
            "freshness": self.freshness.describe() if self.freshness else None,
            "trigger_producer_when_stale": self.trigger_producer_when_stale,
        }


def build(
    name: Any,
    *,
    location: Any = None,
    partitioning: Any = None,
    owner: Any = "",
    description: Any = "",
    freshness: Any = None,
    trigger_producer_when_stale: Any = False,
    params: Any = None,
    declared_in: str = "code",
    origin: str = "",
) -> Dataset:
    """A Dataset value; DatasetError on a bad name, location, partitioning or field type."""
    if not isinstance(name, str) or not NAME.match(name):
        raise DatasetError(
            f"a dataset's name is 1-200 letters, digits, '.', '_' or '-', starting with a letter or "
            f"digit: {str(name)[:60]!r}"
        )
    for field_name, value, limit in (("owner", owner, 200), ("description", description, 2000)):
        if not isinstance(value, str) or len(value) > limit:
            raise DatasetError(f"dataset {name!r}: {field_name} is a string of at most {limit} characters")
    if not isinstance(trigger_producer_when_stale, bool):
        raise DatasetError(f"dataset {name!r}: trigger_producer_when_stale is True or False")
    try:
        checked_params = params_of(params)
    except ValueError as exc:
        raise DatasetError(f"dataset {name!r}: params: {exc}") from None
    try:
        return Dataset(
            name=name,
            location=location_of(location),
            partitioning=partitioning_of(partitioning),
            owner=owner,
            description=description,
            freshness=freshness_of(freshness),
            trigger_producer_when_stale=trigger_producer_when_stale,
            params=checked_params,
            declared_in=declared_in,
            origin=origin,
        )
    except (LocationError, PartitionError, ValueError) as exc:
        raise DatasetError(f"dataset {name!r}: {exc}") from None


_code: Registry[Dataset] = Registry(
    "dataset", app_module="datasets", setting="DATASET_MODULES", origin=lambda entry: entry.origin
)


def dataset(
    name: str,
    *,
    location: str,
    partitioning: Any = None,
    owner: str = "",
    description: str = "",
    freshness: Freshness | None = None,
    trigger_producer_when_stale: bool = False,
    params: Any = None,
) -> Dataset:
    """Declare the dataset `name` in code (see the module's docstring); returns it. With
    `trigger_producer_when_stale=True` (and a freshness policy), each stale episode starts its producer once.
    `params` gives its producer's parameters for a partition (producer_params.py): {"name": "template with
    {partition}, {root} or {location}"} or a function of the partition's key returning such a mapping."""
    caller = sys._getframe(1)
    origin = f"{caller.f_globals.get('__name__', '?')}:{caller.f_lineno}"
    declared = build(
        name,
        location=location,
        partitioning=partitioning,
        owner=owner,
        description=description,
        freshness=freshness,
        trigger_producer_when_stale=trigger_producer_when_stale,
        params=params,
        origin=origin,
    )
    return _code.register(name, declared)


def code_datasets() -> dict[str, Dataset]:
    return _code.entries()


_parsed: list[Any] = [None, None]  # [the DATASETS mapping last parsed, what it gave]


def settings_datasets() -> tuple[dict[str, Dataset], dict[str, str]]:
    """The datasets the DATASETS setting declares, and {name: why} for entries that cannot be used (reported by
    the system check jobsite.E105 and left out). Parsed once per settings object: a lookup on a producer's
    settle must not re-read thousands of declarations."""
    raw = queue_settings.DATASETS
    if _parsed[0] is not raw:
        _parsed[:] = [raw, _parse_settings(raw)]
    return _parsed[1]


def _parse_settings(raw: Any) -> tuple[dict[str, Dataset], dict[str, str]]:
    if not isinstance(raw, Mapping):
        return {}, {"DATASETS": "the DATASETS setting maps names to declarations ({name: {location: ...}})"}
    found, errors = {}, {}
    for name, options in raw.items():
        if not isinstance(options, Mapping):
            errors[str(name)] = "a declaration is a mapping with at least a location"
            continue
        if unknown := set(options) - SETTINGS_KEYS:
            errors[str(name)] = f"unknown keys {', '.join(sorted(map(str, unknown)))} (known: {sorted(SETTINGS_KEYS)})"
            continue
        try:
            found[name] = build(name, **options, declared_in="settings", origin=f"DATASETS[{name!r}]")
        except (DatasetError, TypeError) as exc:
            errors[str(name)] = str(exc)
    return found, errors


def declared_datasets() -> dict[str, Dataset]:
    """Every declared dataset by name, in order: code's, with settings' in place of a code one of the same name."""
    return dict(sorted({**code_datasets(), **settings_datasets()[0]}.items()))


def get_dataset(name: Any) -> Dataset:
    """The declared dataset `name` (settings' before code's); DatasetError naming the close names otherwise."""
    if isinstance(name, str):
        found = settings_datasets()[0].get(name) or _code.get(name)
        if found is not None:
            return found
    known = declared_datasets()
    hint = _code.did_you_mean(name, list(known))
    shown = name[:60] + "..." if isinstance(name, str) and len(name) > 60 else name
    listed = ", ".join(list(known)[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    raise DatasetError(f"unknown dataset {shown!r}{hint}; declared: {listed or '(none)'}")
