"""Partitionings as value types with one canonical text key per partition (DESIGN.md: keys are text in canonical
form, so a dataset's partitions in a range are an index scan over plain strings).

    daily   -> "2026-11-26"        (a UTC date)
    hourly  -> "2026-11-26T05"     (a UTC hour)
    static  -> the key itself      (StaticPartitions(["eu", "us"]))
    none    -> ""                  (an unpartitioned dataset has one partition, the empty key)

`key(value)` validates and canonicalises a date, a datetime (the partition that contains it, in UTC) or a string
(the canonical key, or for hourly an ISO datetime exactly on the hour); `keys(start, end)` enumerates a range,
both ends included. Time keys sort as text in time order. Plain Python: no Django.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from typing import Any

MAX_RANGE = 100_000  # partitions one keys() call may enumerate: a typo in a range must not build a huge list
STATIC_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,99}$")
_DAILY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_HOURLY = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}$")


class PartitionError(ValueError):
    """A partition key or range that does not fit a partitioning; the message says why."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _utc(value: dt.datetime) -> dt.datetime:
    """A datetime in UTC; a naive one is taken as UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Partitioning:
    """How a dataset is cut into partitions. `kind` is "none", "daily", "hourly" or "static"."""

    kind = "none"

    def key(self, value: Any = None) -> str:
        if value in (None, ""):
            return ""
        raise PartitionError(f"the dataset is not partitioned: no partition may be given (got {_shown(value)})")

    def keys(self, start: Any, end: Any) -> list[str]:
        raise PartitionError("the dataset is not partitioned: it has no range of partitions")

    def problems(self) -> list[str]:
        """What is wrong with the declaration itself (a system check reports it); [] when nothing is."""
        return []

    def describe(self) -> str | dict[str, Any] | None:
        """The JSON form, as declared: None, "daily", "hourly" or {"static": [keys]}."""
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partitioning) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(repr(self.describe()))

    def __repr__(self) -> str:
        return f"<{self.kind} partitioning>"


class TimePartitions(Partitioning):
    """Daily or hourly partitions in UTC: a fixed step from a canonical start."""

    step: dt.timedelta
    named: str  # "a daily", "an hourly": in messages
    fmt: str
    pattern: re.Pattern[str]

    def start_of(self, value: dt.datetime) -> dt.datetime:  # pragma: no cover - interface
        raise NotImplementedError

    def parse(self, key: str) -> dt.datetime:
        """The start (UTC) of the partition `key` names; PartitionError unless it is a canonical key."""
        if not isinstance(key, str) or not self.pattern.match(key):
            raise PartitionError(f"{_shown(key)} is not {self.named} partition key like {self.example}")
        try:
            return dt.datetime.strptime(key, self.fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            raise PartitionError(f"{_shown(key)} is not {self.named} partition key: no such date or hour") from None

    def text(self, start: dt.datetime) -> str:  # pragma: no cover - interface
        """The canonical key of the partition starting at `start` (isoformat, not strftime: %Y is not
        zero-padded before year 1000 on every platform)."""
        raise NotImplementedError

    def key(self, value: Any = None) -> str:
        if isinstance(value, dt.datetime):
            try:
                return self.text(self.start_of(_utc(value)))
            except OverflowError:
                raise PartitionError(f"{_shown(value)} is outside the years 1-9999 in UTC") from None
        if isinstance(value, dt.date):
            return self.text(self.start_of(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)))
        if isinstance(value, str):
            return self.key_of_text(value)
        raise PartitionError(
            f"a {self.kind} partition is a date, a datetime or a key like {self.example}, got {_shown(value)}"
        )

    def key_of_text(self, text: str) -> str:
        return self.text(self.parse(text))

    def keys(self, start: Any, end: Any) -> list[str]:
        first, last = self.parse(self.key(start)), self.parse(self.key(end))
        if last < first:
            raise PartitionError(f"the range ends ({self.key(end)}) before it starts ({self.key(start)})")
        count = (last - first) // self.step + 1
        if count > MAX_RANGE:
            raise PartitionError(f"the range holds {count} {self.kind} partitions; at most {MAX_RANGE}")
        return [self.text(first + i * self.step) for i in range(count)]

    def describe(self) -> str:
        return self.kind


class DailyPartitions(TimePartitions):
    kind = "daily"
    named = "a daily"
    step = dt.timedelta(days=1)
    fmt = "%Y-%m-%d"
    pattern = _DAILY
    example = "2026-11-26"

    def start_of(self, value: dt.datetime) -> dt.datetime:
        return value.replace(hour=0, minute=0, second=0, microsecond=0)

    def text(self, start: dt.datetime) -> str:
        return start.date().isoformat()


class HourlyPartitions(TimePartitions):
    kind = "hourly"
    named = "an hourly"
    step = dt.timedelta(hours=1)
    fmt = "%Y-%m-%dT%H"
    pattern = _HOURLY
    example = "2026-11-26T05"

    def start_of(self, value: dt.datetime) -> dt.datetime:
        return value.replace(minute=0, second=0, microsecond=0)

    def text(self, start: dt.datetime) -> str:
        return f"{start.date().isoformat()}T{start.hour:02d}"

    def key_of_text(self, text: str) -> str:
        """The canonical key, or an ISO datetime exactly on an hour (an offset is converted to UTC)."""
        if _HOURLY.match(text) or len(text) > 40:
            return super().key_of_text(text)
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            return super().key_of_text(text)  # the canonical key's message
        if "T" not in text:
            return super().key_of_text(text)
        if (moment.minute, moment.second, moment.microsecond) != (0, 0, 0):
            raise PartitionError(
                f"{_shown(text)} is not on the hour: an hourly partition key looks like {self.example}"
            )
        return self.key(moment)


class StaticPartitions(Partitioning):
    """A fixed set of keys (regions, tenants): each 1-100 letters, digits, '_', '.', '=' or '-', starting with a
    letter or digit, so a key is safe in a path. Declared keys are kept as given; `problems()` says which are
    bad (a system check reports them) and `key()` accepts only a declared, valid key."""

    kind = "static"

    def __init__(self, keys: Iterable[str]) -> None:
        self.declared = tuple(keys) if not isinstance(keys, str) else (keys,)
        self.valid = frozenset(k for k in self.declared if isinstance(k, str) and STATIC_KEY.match(k))

    def problems(self) -> list[str]:
        found = []
        if not self.declared:
            found.append("a static partitioning needs at least one key")
        for key in self.declared:
            if not (isinstance(key, str) and STATIC_KEY.match(key)):
                found.append(
                    f"static partition key {_shown(key)} is not 1-100 letters, digits, '_', '.', '=' or "
                    "'-' starting with a letter or digit"
                )
        if len(set(map(repr, self.declared))) != len(self.declared):
            found.append("a static partition key is declared twice")
        return found

    def key(self, value: Any = None) -> str:
        if isinstance(value, str) and value in self.valid:
            return value
        known = ", ".join(sorted(self.valid)[:20]) or "(none)"
        raise PartitionError(f"{_shown(value)} is not one of the static partitions: {known}")

    def keys(self, start: Any, end: Any) -> list[str]:
        first, last = self.key(start), self.key(end)
        if last < first:
            raise PartitionError(f"the range ends ({last}) before it starts ({first})")
        return sorted(k for k in self.valid if first <= k <= last)

    def describe(self) -> dict[str, Any]:
        return {"static": [k if isinstance(k, str) else repr(k) for k in self.declared]}


DAILY = DailyPartitions()
HOURLY = HourlyPartitions()
NONE = Partitioning()


def partitioning_of(value: Any) -> Partitioning:
    """The Partitioning a declaration names: None, "daily", "hourly", a StaticPartitions, {"static": [keys]} or
    a list of static keys (the JSON forms settings use). PartitionError for anything else."""
    if isinstance(value, Partitioning):
        return value
    if value is None or value == "none":
        return NONE
    if value == "daily":
        return DAILY
    if value == "hourly":
        return HOURLY
    if isinstance(value, dict) and set(value) == {"static"} and isinstance(value["static"], list | tuple):
        return StaticPartitions(value["static"])
    if isinstance(value, list | tuple):
        return StaticPartitions(value)
    raise PartitionError(
        f"partitioning {_shown(value)}: use None, 'daily', 'hourly' or StaticPartitions([...]) "
        '({"static": [...]} in settings)'
    )
