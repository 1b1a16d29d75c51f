"""Partition mappings: which partitions of an upstream dataset one partition of its consumer reads, declared on the
consumer's upstream (datasets/triggers.py decides readiness from all of them).

    on_update={"events": "day"}                                    # identity: the same partition (the default)
    on_update={"events": ("day", TimeWindow(last=7))}              # the last 7 days, up to the consumer's day
    on_update={"daily_sales": ("week", TimeWindow(to="weekly"))}   # coarser from finer: a week reads its 7 days
    on_update={"sales": ("day", AllOf("region"))}                  # fan-in: day D of every region -> day D
    on_update={"raw": ("zone", StaticMap({"eu-west": "eu", "eu-north": "eu", "us-east": "us"}))}

In settings (JSON): {"window": {"last": 7}}, {"window": {"to": "weekly"}}, {"all_of": "region"},
{"map": {"eu-west": "eu"}}. A mapping acts on the time dimension (TimeWindow), the dimension it names (AllOf) or
the one static/dynamic dimension (StaticMap, or `dimension=`); the consumer's other dimensions are the
upstream's, key for key. Each gives `upstream_keys(up, down, key)` (the upstream partitions a consumer partition
reads, in key order) and `downstream_keys(up, down, key)` (the consumer partitions an upstream partition feeds),
and `target(up)`: the consumer's partitioning it implies (None: the consumer's produced dataset says). Plain
Python over partitions.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .partitions import (
    SEPARATOR,
    MultiPartitions,
    PartitionError,
    Partitioning,
    StaticPartitions,
    TimePartitions,
    all_keys,
    partitioning_of,
)

MAX_NAMED = 1_000  # upstream partitions one consumer partition may read


def _time_axis(part: Partitioning) -> tuple[int | None, TimePartitions]:
    """(the time dimension's position, or None for a one-dimension time partitioning, its partitioning)."""
    if isinstance(part, TimePartitions):
        return None, part
    if isinstance(part, MultiPartitions) and part.time is not None:
        return part.time
    raise PartitionError(f"a {part.kind} partitioning has no time dimension")


def _split(key: str, index: int | None) -> tuple[list[str], str]:
    if index is None:
        return [], key
    parts = key.split(SEPARATOR)
    return parts, parts[index]


def _join(parts: list[str], index: int | None, value: str) -> str:
    if index is None:
        return value
    return SEPARATOR.join([*parts[:index], value, *parts[index + 1 :]])


class Mapping:
    kind = "identity"

    def upstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        return [key]

    def downstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        return [key]

    def target(self, up: Partitioning) -> Partitioning | None:
        return up

    def problems(self, up: Partitioning, down: Partitioning) -> list[str]:
        if up != down:
            return [
                f"identity maps a partition to the same one: the upstream is {up.describe()!r}, the consumer "
                f"{down.describe()!r} (declare a mapping)"
            ]
        return []

    def describe(self) -> dict[str, Any]:
        return {"identity": True}

    @property
    def label(self) -> str:
        return "identity"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(repr(self.describe()))

    def __repr__(self) -> str:
        return f"<{self.label} mapping>"


IDENTITY = Mapping()


class TimeWindow(Mapping):
    """The consumer's time partition reads the upstream time partitions inside it (`to="weekly"`: a week from
    its days), or with `last=N` the N upstream partitions ending with the one that holds its end. Other
    dimensions map to themselves."""

    kind = "window"

    def __init__(self, last: int | None = None, *, to: Any = None) -> None:
        if last is not None and (isinstance(last, bool) or not isinstance(last, int) or not 1 <= last <= MAX_NAMED):
            raise PartitionError(f"a window's last is a whole number from 1 to {MAX_NAMED}, got {last!r}")
        self.last = last
        self.to = partitioning_of(to) if to is not None else None
        if self.to is not None and not isinstance(self.to, TimePartitions):
            raise PartitionError(f"a window maps to a time grain ('daily', 'weekly', 'hourly'), got {to!r}")
        if last is None and to is None:
            raise PartitionError("a window says last=N, to=GRAIN or both")

    def _window(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        ui, ut = _time_axis(up)
        di, dt_ = _time_axis(down)
        parts, value = _split(key, di)
        start = dt_.parse(value)
        end = start + dt_.step - dt.timedelta(microseconds=1)
        if self.last is None:
            times = ut.keys(ut.key(start), ut.key(end))
        else:
            last_start = ut.parse(ut.key(end))
            times = [ut.text(last_start - i * ut.step) for i in range(self.last - 1, -1, -1)]
        return [_join(parts, ui, t) for t in times]

    def upstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        return self._window(up, down, key)

    def downstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        ui, ut = _time_axis(up)
        di, dt_ = _time_axis(down)
        parts, value = _split(key, ui)
        start = ut.parse(value)
        reach = ut.step * (self.last or 1) - dt.timedelta(microseconds=1)
        candidates = [_join(parts, di, t) for t in dt_.keys(dt_.key(start), dt_.key(start + reach))]
        return [c for c in candidates if key in self._window(up, down, c)]

    def target(self, up: Partitioning) -> Partitioning | None:
        if self.to is None:
            return up
        index, _time = _time_axis(up)
        if index is None:
            return self.to
        assert isinstance(up, MultiPartitions)
        return MultiPartitions([(n, self.to if i == index else p) for i, (n, p) in enumerate(up.dimensions)])

    def problems(self, up: Partitioning, down: Partitioning) -> list[str]:
        try:
            ui, ut = _time_axis(up)
            di, dt_ = _time_axis(down)
        except PartitionError as exc:
            return [f"a time window: {exc}"]
        if (ui is None) != (di is None) or (
            isinstance(up, MultiPartitions)
            and [(n, p) for i, (n, p) in enumerate(up.dimensions) if i != ui]
            != [(n, p) for i, (n, p) in enumerate(down.dimensions) if i != di]  # type: ignore[union-attr]
        ):
            return ["a time window maps the time dimension only: the other dimensions are the same on both sides"]
        if self.last is None and ut.step > dt_.step:
            return [f"a window without last=N reads finer partitions into coarser ones: {ut.kind} into {dt_.kind}"]
        return []

    def describe(self) -> dict[str, Any]:
        window: dict[str, Any] = {}
        if self.last is not None:
            window["last"] = self.last
        if self.to is not None:
            window["to"] = self.to.describe()
        return {"window": window}

    @property
    def label(self) -> str:
        shown = [f"last {self.last}"] if self.last else []
        return "window " + " ".join([*shown, *([f"to {self.to.kind}"] if self.to else [])])


class AllOf(Mapping):
    """Fan-in: a consumer partition reads the upstream partitions of every key of the upstream's `dimension`,
    the other dimensions the same (sales by day|region -> a day of all regions). The consumer has the upstream's
    dimensions without that one."""

    kind = "all_of"

    def __init__(self, dimension: str) -> None:
        if not isinstance(dimension, str) or not dimension:
            raise PartitionError(f"all_of names a dimension, got {dimension!r}")
        self.dimension = dimension

    def _index(self, up: Partitioning) -> int:
        if not isinstance(up, MultiPartitions) or self.dimension not in up.names:
            raise PartitionError(f"all_of({self.dimension!r}): the upstream has no dimension {self.dimension!r}")
        return up.names.index(self.dimension)

    def upstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        index = self._index(up)
        assert isinstance(up, MultiPartitions)
        rest = key.split(SEPARATOR) if isinstance(down, MultiPartitions) else [key]
        return [SEPARATOR.join([*rest[:index], k, *rest[index:]]) for k in all_keys(up.dimensions[index][1])]

    def downstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        index = self._index(up)
        parts = key.split(SEPARATOR)
        return [SEPARATOR.join(parts[:index] + parts[index + 1 :])]

    def target(self, up: Partitioning) -> Partitioning | None:
        index = self._index(up)
        assert isinstance(up, MultiPartitions)
        rest = [d for i, d in enumerate(up.dimensions) if i != index]
        return rest[0][1] if len(rest) == 1 else MultiPartitions(rest)

    def problems(self, up: Partitioning, down: Partitioning) -> list[str]:
        try:
            index = self._index(up)
            if isinstance(up.dimension(self.dimension), TimePartitions):  # type: ignore[attr-defined]
                return [f"all_of({self.dimension!r}): a time dimension has no list of every key (use a window)"]
            if self.target(up) != down:
                return [
                    f"all_of({self.dimension!r}): the consumer is partitioned {down.describe()!r}, not as the "
                    f"upstream without {self.dimension!r} ({self.target(up).describe()!r})"
                ]  # type: ignore[union-attr]
        except PartitionError as exc:
            return [str(exc)]
        del index
        return []

    def describe(self) -> dict[str, Any]:
        return {"all_of": self.dimension}

    @property
    def label(self) -> str:
        return f"all of {self.dimension}"


class StaticMap(Mapping):
    """Upstream key -> consumer key on one static or dynamic dimension (`dimension=` in a multi partitioning):
    a consumer partition reads every upstream key mapped to it."""

    kind = "map"

    def __init__(self, pairs: Any, *, dimension: str | None = None) -> None:
        if (
            not isinstance(pairs, dict)
            or not pairs
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items())
        ):
            raise PartitionError("a static map is a non-empty {upstream key: consumer key} of strings")
        self.pairs = dict(sorted(pairs.items()))
        self.dimension = dimension

    def _index(self, part: Partitioning) -> int | None:
        if not isinstance(part, MultiPartitions):
            return None
        if self.dimension is None:
            raise PartitionError("a static map on a multi-dimension partitioning names its dimension=")
        return part.names.index(self.dimension) if self.dimension in part.names else -1

    def upstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        index = self._index(down)
        parts, value = _split(key, index)
        return [_join(parts, index, u) for u, d in self.pairs.items() if d == value]

    def downstream_keys(self, up: Partitioning, down: Partitioning, key: str) -> list[str]:
        index = self._index(up)
        parts, value = _split(key, index)
        return [_join(parts, index, self.pairs[value])] if value in self.pairs else []

    def target(self, up: Partitioning) -> Partitioning | None:
        return None  # the consumer's produced dataset says

    def problems(self, up: Partitioning, down: Partitioning) -> list[str]:
        try:
            ui, di = self._index(up), self._index(down)
        except PartitionError as exc:
            return [str(exc)]
        if ui == -1 or di == -1:
            return [f"a static map: no dimension {self.dimension!r} on both sides"]
        found = []
        for side, part, index, keys in (("upstream", up, ui, self.pairs), ("consumer", down, di, self.pairs.values())):
            axis = part if index is None else part.dimensions[index][1]  # type: ignore[attr-defined]
            if isinstance(axis, StaticPartitions):
                found += [f"a static map: {k!r} is not a key of the {side}" for k in keys if k not in axis.valid]
            elif axis.kind != "dynamic":
                found.append(f"a static map maps static or dynamic keys; the {side}'s are {axis.kind}")
        return found

    def describe(self) -> dict[str, Any]:
        return {"map": self.pairs, **({"dimension": self.dimension} if self.dimension else {})}

    @property
    def label(self) -> str:
        return f"map ({len(self.pairs)} keys)"


def mapping_of(value: Any) -> Mapping:
    """A Mapping from a Mapping, None (identity) or its JSON form; PartitionError otherwise."""
    if isinstance(value, Mapping):
        return value
    if value is None or value == {"identity": True}:
        return IDENTITY
    if isinstance(value, dict) and set(value) == {"window"} and isinstance(value["window"], dict):
        window = value["window"]
        if set(window) - {"last", "to"}:
            raise PartitionError(f"a window takes last and to, got {sorted(window)}")
        return TimeWindow(window.get("last"), to=window.get("to"))
    if isinstance(value, dict) and set(value) == {"all_of"}:
        return AllOf(value["all_of"])
    if isinstance(value, dict) and set(value) in ({"map"}, {"map", "dimension"}):
        return StaticMap(value["map"], dimension=value.get("dimension"))
    raise PartitionError(
        f"mapping {str(value)[:60]!r}: use TimeWindow(...), AllOf(dimension), StaticMap({{...}}) or "
        '{"window": {...}}, {"all_of": name}, {"map": {...}} in settings'
    )
