"""Partitionings as value types with one canonical text key per partition (DESIGN.md: keys are text in canonical
form, so a dataset's partitions in a range are an index scan over plain strings).

    daily   -> "2026-11-26"        (a UTC date)
    hourly  -> "2026-11-26T05"     (a UTC hour)
    weekly  -> "2026-W48"          (an ISO week, Monday to Sunday in UTC)
    static  -> the key itself      (StaticPartitions(["eu", "us"]))
    dynamic -> the key itself      (DynamicPartitions("customers"): keys added and removed at run time)
    none    -> ""                  (an unpartitioned dataset has one partition, the empty key)
    multi   -> "2026-11-26|eu"     (MultiPartitions(day="daily", region=StaticPartitions([...])): one key per
                                    dimension, in the order declared, joined by "|")

`key(value)` validates and canonicalises a date, a datetime (the partition that contains it, in UTC) or a string
(the canonical key, or for hourly an ISO datetime exactly on the hour); `keys(start, end)` enumerates a range,
both ends included. Time keys sort as text in time order. Plain Python: no Django (a dynamic set's current keys
come from a lookup the datasets app installs, dynamic.py).
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterable
from typing import Any

MAX_RANGE = 100_000  # partitions one keys() call may enumerate: a typo in a range must not build a huge list
STATIC_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,99}$")
_DAILY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_HOURLY = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}$")
_WEEKLY = re.compile(r"^\d{4}-W\d{2}$")
DIMENSION_NAME = re.compile(r"^[a-z][a-z0-9_]{0,49}$")
SEPARATOR = "|"  # between a multi-dimension key's parts: never in a time, static or dynamic key
MAX_KEY = 200  # the partition columns' width


class PartitionError(ValueError):
    """A partition key or range that does not fit a partitioning; the message says why."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _utc(value: dt.datetime) -> dt.datetime:
    """A datetime in UTC; a naive one is taken as UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Partitioning:
    """How a dataset is cut into partitions. `kind` is "none", "daily", "hourly", "weekly", "static", "dynamic"
    or "multi"."""

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
        """The JSON form, as declared: None, "daily", "hourly", "weekly", {"static": [keys]}, {"dynamic": name}
        or {"dimensions": [{"name", "partitioning"}, ...]}."""
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


class WeeklyPartitions(TimePartitions):
    """ISO weeks in UTC (Monday 00:00 to Monday 00:00), keyed "2026-W48" (the ISO year, which may differ from the
    calendar year around New Year): the keys sort as text in time order."""

    kind = "weekly"
    named = "a weekly"
    step = dt.timedelta(days=7)
    pattern = _WEEKLY
    example = "2026-W48"

    def start_of(self, value: dt.datetime) -> dt.datetime:
        day = value.replace(hour=0, minute=0, second=0, microsecond=0)
        return day - dt.timedelta(days=day.weekday())

    def parse(self, key: str) -> dt.datetime:
        if not isinstance(key, str) or not self.pattern.match(key):
            raise PartitionError(f"{_shown(key)} is not a weekly partition key like {self.example}")
        try:
            day = dt.date.fromisocalendar(int(key[:4]), int(key[6:]), 1)
        except ValueError:
            raise PartitionError(f"{_shown(key)} is not a weekly partition key: no such ISO week") from None
        return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)

    def text(self, start: dt.datetime) -> str:
        year, week, _ = start.date().isocalendar()
        return f"{year:04d}-W{week:02d}"

    def key_of_text(self, text: str) -> str:
        """A weekly key, or a date (the week that holds it)."""
        if _DAILY.match(text):
            return self.key(DAILY.parse(text))
        return self.text(self.parse(text))


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


class DynamicPartitions(Partitioning):
    """A set of keys added and removed at run time (a customer, a file source), named so several datasets may
    share it: `DynamicPartitions("customers")`. A key has the static keys' shape; `key()` accepts one that is in
    the set now (the datasets app's lookup, dynamic.py), so a removed key takes no new materialization while its
    history stays."""

    kind = "dynamic"

    def __init__(self, name: str) -> None:
        self.name = name

    def problems(self) -> list[str]:
        if not (isinstance(self.name, str) and STATIC_KEY.match(self.name)):
            return [
                f"a dynamic partition set's name {_shown(self.name)} is not 1-100 letters, digits, '_', '.', '=' "
                "or '-' starting with a letter or digit"
            ]
        return []

    def syntax(self, value: Any) -> str:
        if isinstance(value, str) and STATIC_KEY.match(value):
            return value
        raise PartitionError(
            f"{_shown(value)} is not a dynamic partition key: 1-100 letters, digits, '_', '.', '=' or '-' starting "
            "with a letter or digit"
        )

    def key(self, value: Any = None) -> str:
        key = self.syntax(value)
        if key not in dynamic_lookup.keys(self.name, [key]):
            raise PartitionError(
                f"{key!r} is not a partition of the dynamic set {self.name!r} (add it: dataset partitions add)"
            )
        return key

    def all_keys(self) -> list[str]:
        return sorted(dynamic_lookup.keys(self.name, None))

    def keys(self, start: Any, end: Any) -> list[str]:
        first, last = self.key(start), self.key(end)
        if last < first:
            raise PartitionError(f"the range ends ({last}) before it starts ({first})")
        return [k for k in self.all_keys() if first <= k <= last]

    def describe(self) -> dict[str, Any]:
        return {"dynamic": self.name}


class _NoLookup:
    """Before the datasets app installs its lookup (plain Python use): no dynamic set has a key."""

    def keys(self, name: str, wanted: list[str] | None) -> set[str]:
        return set()


dynamic_lookup: Any = _NoLookup()  # .keys(set name, [keys] or None for all) -> the current keys among them


def all_keys(partitioning: Partitioning) -> list[str]:
    """Every key of a static or dynamic partitioning (a dimension's `*`); PartitionError for a time one."""
    if isinstance(partitioning, StaticPartitions):
        return sorted(partitioning.valid)
    if isinstance(partitioning, DynamicPartitions):
        return partitioning.all_keys()
    raise PartitionError(f"a {partitioning.kind} dimension has no list of every key: give a range")


class MultiPartitions(Partitioning):
    """Several dimensions, in the order declared: `MultiPartitions(day="daily", region=StaticPartitions(["eu",
    "us"]))`. A key is one key per dimension joined by "|" ("2026-11-26|eu"); at most one dimension is by time
    (the one ranges run over). `parts(key)` gives {dimension: key}; every message names the dimension."""

    kind = "multi"

    def __init__(self, dimensions: Any = None, /, **named: Any) -> None:
        pairs = list(dimensions.items()) if isinstance(dimensions, dict) else list(dimensions or [])
        pairs += list(named.items())
        self.dimensions: tuple[tuple[str, Partitioning], ...] = tuple((str(n), partitioning_of(p)) for n, p in pairs)
        self.names = tuple(n for n, _p in self.dimensions)

        if shape := self.shape_problems():
            raise PartitionError(shape[0])

    def shape_problems(self) -> list[str]:
        found = []
        if len(self.dimensions) < 2:
            found.append("a multi-dimension partitioning needs at least two dimensions")
        if len(set(self.names)) != len(self.names):
            found.append(f"a dimension is declared twice: {list(self.names)}")
        for name, part in self.dimensions:
            if not DIMENSION_NAME.match(name):
                found.append(f"dimension {name[:60]!r}: a name is 1-50 lower-case letters, digits or '_'")
            if part.kind in ("none", "multi"):
                found.append(f"dimension {name!r}: a dimension is daily, hourly, weekly, static or dynamic")
        if len([1 for _n, p in self.dimensions if isinstance(p, TimePartitions)]) > 1:
            found.append("at most one dimension is by time")
        return found

    def problems(self) -> list[str]:
        return [f"dimension {n!r}: {problem}" for n, p in self.dimensions for problem in p.problems()]

    @property
    def time(self) -> tuple[int, TimePartitions] | None:
        """(position, partitioning) of the time dimension, if there is one."""
        for i, (_n, p) in enumerate(self.dimensions):
            if isinstance(p, TimePartitions):
                return i, p
        return None

    def dimension(self, name: str) -> Partitioning:
        for n, p in self.dimensions:
            if n == name:
                return p
        raise PartitionError(f"no dimension {name!r}: the dimensions are {', '.join(self.names)}")

    def split(self, value: Any) -> list[Any]:
        """The per-dimension values of a key text, a {dimension: value} mapping or a sequence, in order."""
        count = len(self.dimensions)
        if isinstance(value, str):
            parts = value.split(SEPARATOR)
        elif isinstance(value, dict):
            if set(value) != set(self.names):
                raise PartitionError(
                    f"a partition names every dimension ({', '.join(self.names)}), got {sorted(map(str, value))}"
                )
            parts = [value[n] for n in self.names]
        elif isinstance(value, list | tuple):
            parts = list(value)
        else:
            raise PartitionError(
                f"a partition of dimensions {', '.join(self.names)} is a key like {self.example}, a mapping "
                f"{{dimension: value}} or a sequence, got {_shown(value)}"
            )
        if len(parts) != count:
            raise PartitionError(
                f"{_shown(value)} has {len(parts)} part(s); a partition has one per dimension "
                f"({SEPARATOR.join(self.names)}), like {self.example}"
            )
        return parts

    @property
    def example(self) -> str:
        shown = []
        for _n, p in self.dimensions:
            if isinstance(p, TimePartitions):
                shown.append(p.example)
            elif isinstance(p, StaticPartitions) and p.valid:
                shown.append(sorted(p.valid)[0])
            else:
                shown.append("key")
        return SEPARATOR.join(shown)

    def key(self, value: Any = None) -> str:
        parts = []
        for (name, part), given in zip(self.dimensions, self.split(value), strict=True):
            try:
                parts.append(part.key(given))
            except PartitionError as exc:
                raise PartitionError(f"dimension {name!r}: {exc}") from None
        key = SEPARATOR.join(parts)
        if len(key) > MAX_KEY:
            raise PartitionError(f"the key {_shown(key)} is longer than {MAX_KEY} characters")
        return key

    def parts(self, key: str) -> dict[str, str]:
        """{dimension: its key} of a canonical key (checked)."""
        return dict(zip(self.names, self.key(key).split(SEPARATOR), strict=True))

    def keys(self, start: Any, end: Any) -> list[str]:
        """The keys from `start` to `end`: the time dimension runs over its range; every other dimension is the
        same at both ends, or `*` (every key of it)."""
        first, last = self.split(start), self.split(end)
        axes = []
        for (name, part), a, b in zip(self.dimensions, first, last, strict=True):
            try:
                if a == "*" or b == "*":
                    if a != b:
                        raise PartitionError("'*' at one end of a range is '*' at the other")
                    axes.append(all_keys(part))
                elif isinstance(part, TimePartitions):
                    axes.append(part.keys(a, b))
                else:
                    one, other = part.key(a), part.key(b)
                    if one != other:
                        raise PartitionError(
                            f"a range runs over the time dimension only: fix it ({one} or {other}) or give '*'"
                        )
                    axes.append([one])
            except PartitionError as exc:
                raise PartitionError(f"dimension {name!r}: {exc}") from None
        count = 1
        for axis in axes:
            count *= len(axis)
        if count > MAX_RANGE:
            raise PartitionError(f"the range holds {count} partitions; at most {MAX_RANGE}")
        return [SEPARATOR.join(combo) for combo in itertools.product(*axes)]

    def describe(self) -> dict[str, Any]:
        return {"dimensions": [{"name": n, "partitioning": p.describe()} for n, p in self.dimensions]}

    def __repr__(self) -> str:
        return f"<multi partitioning {SEPARATOR.join(self.names)}>"


DAILY = DailyPartitions()
HOURLY = HourlyPartitions()
WEEKLY = WeeklyPartitions()
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
    if value == "weekly":
        return WEEKLY
    if isinstance(value, dict) and set(value) == {"dynamic"}:
        return DynamicPartitions(value["dynamic"])
    if isinstance(value, dict) and set(value) == {"dimensions"}:
        return _multi_of(value["dimensions"])
    if isinstance(value, dict) and set(value) == {"static"} and isinstance(value["static"], list | tuple):
        return StaticPartitions(value["static"])
    if isinstance(value, list | tuple):
        return StaticPartitions(value)
    raise PartitionError(
        f"partitioning {_shown(value)}: use None, 'daily', 'hourly', 'weekly', StaticPartitions([...]), "
        'DynamicPartitions(name) or MultiPartitions(...) ({"static": [...]}, {"dynamic": name} or {"dimensions": '
        "{name: partitioning, ...}} in settings)"
    )


def _multi_of(dimensions: Any) -> MultiPartitions:
    """{"dimensions": {name: partitioning}} or [{"name", "partitioning"}] (the described form)."""
    if isinstance(dimensions, dict):
        return MultiPartitions(dimensions)
    if isinstance(dimensions, list | tuple) and all(
        isinstance(d, dict) and set(d) == {"name", "partitioning"} for d in dimensions
    ):
        return MultiPartitions([(d["name"], d["partitioning"]) for d in dimensions])
    raise PartitionError('"dimensions" maps names to partitionings: {"day": "daily", "region": {"static": [...]}}')
