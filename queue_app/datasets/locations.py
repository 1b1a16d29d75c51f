"""Where a dataset lives: a path under an allowed dataset root, or a table (`table:schema.name`).

A path may hold `{partition}`, replaced by the canonical partition key (`events/day={partition}`), so one
partition's files are found by `observe`. A relative path is under the first root. The roots are the
colon-separated `JOBSITE_DATASET_ROOTS` plus the `DATASET_ROOTS` setting, or the project's data directory
(JOBSITE["VAR_DIR"]) when both are empty. Symlinks and `..` are resolved before the check (as for Spark scripts,
spark/scripts.py), so a link cannot lead a dataset outside the roots.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from queue_app.conf import queue_settings, var_dir

ROOTS_ENV = "JOBSITE_DATASET_ROOTS"
PLACEHOLDER = "{partition}"
_TABLE = re.compile(r"^table:([A-Za-z_][A-Za-z0-9_]{0,62})\.([A-Za-z_][A-Za-z0-9_]{0,62})$")


class LocationError(ValueError):
    """A location that is not acceptable; the message says why."""


def dataset_roots() -> list[str]:
    """Real paths of the directories datasets may live under (configured roots that do not exist are kept: a
    dataset under one is checked, and only observing it needs the directory)."""
    raw = [p for p in os.environ.get(ROOTS_ENV, "").split(":") if p.strip()]
    raw += [str(p) for p in queue_settings.DATASET_ROOTS]
    if not raw:
        raw = [str(var_dir())]
    roots = []
    for path in raw:
        real = os.path.realpath(os.path.expanduser(path.strip()))
        if real not in roots:
            roots.append(real)
    return roots


def within_roots(real: str, roots: list[str]) -> bool:
    """Whether the real path `real` lies under one of `roots`."""
    return any(os.path.commonpath([real, root]) == root for root in roots)


@dataclass(frozen=True)
class Location:
    """A parsed location: `table` set for a table, else `path` (as declared, maybe with {partition})."""

    text: str
    path: str = ""
    table: str = ""

    @property
    def partitioned(self) -> bool:
        return PLACEHOLDER in self.path

    def resolve(self, partition: str = "") -> str:
        """The real path of the location (of one partition, when the path holds {partition}); LocationError if
        it lies outside the roots."""
        if self.table:
            raise LocationError(f"{self.text} is a table, not a path")
        roots = dataset_roots()
        path = self.path.replace(PLACEHOLDER, partition)
        if "/" in partition or partition in (".", ".."):
            raise LocationError(f"partition {partition!r} cannot be part of a path")
        joined = path if os.path.isabs(path) else os.path.join(roots[0], path)
        real = os.path.realpath(os.path.expanduser(joined))
        if not within_roots(real, roots):
            raise LocationError(
                f"location {self.path} (resolved: {real}) is outside the allowed dataset roots ({':'.join(roots)}); "
                f"add its directory to {ROOTS_ENV} or the DATASET_ROOTS setting"
            )
        return real


def location_of(text: object) -> Location:
    """Parse a declared location; LocationError for one that is not a usable path or table name."""
    if not isinstance(text, str) or not text.strip():
        raise LocationError("a dataset needs a location: a path under a dataset root or table:schema.name")
    if "\0" in text or len(text) > 1000:
        raise LocationError("a location is at most 1000 characters, without NUL bytes")
    if text.startswith("table:"):
        match = _TABLE.match(text)
        if match is None:
            raise LocationError(f"{text!r} is not table:schema.name (identifiers of letters, digits and _)")
        return Location(text=text, table=f"{match.group(1)}.{match.group(2)}")
    if text.count(PLACEHOLDER) > 1 or ("{" in text.replace(PLACEHOLDER, "")) or ("}" in text.replace(PLACEHOLDER, "")):
        raise LocationError(f"location {text!r}: the only placeholder is {PLACEHOLDER}, at most once")
    return Location(text=text, path=text)
