"""Freshness policies and the one pure function that judges them.

    Freshness(max_age=timedelta(hours=26))   the newest materialization is at most 26 h old
    Freshness(partition_by="06:00")          a daily dataset's partition for day D exists by D+1 06:00 UTC

`freshness_state(dataset, latest, now)` -> "fresh" | "stale" | "missing" | "unknown", from the dataset's newest
materializations (anything with `.partition` and `.at`): "missing" when there is none, "unknown" when the dataset
declares no policy. Boundaries are inclusive on the fresh side: an age of exactly max_age is fresh; at exactly
06:00 the previous day's partition is due. Plain Python: no Django, no clock of its own (the caller passes now).

`overdue_since(dataset, latest, now)` -> when a stale dataset went past its policy, and `staleness_seconds` -> how
long ago that is (0 while fresh; None when it cannot be said: missing, unknown), what /metrics exports as
jobsite_dataset_staleness_seconds.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

FRESHNESS_STATES = ("fresh", "stale", "missing", "unknown")
_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class Materialized(Protocol):
    partition: str
    at: dt.datetime


@dataclass(frozen=True)
class Freshness:
    """One of max_age (a positive timedelta) or partition_by ("HH:MM" UTC, daily datasets only). Kept as
    declared; `problems()` says what is wrong (a system check reports it)."""

    max_age: dt.timedelta | None = None
    partition_by: str | None = None

    def problems(self, partitioning: Any) -> list[str]:
        if (self.max_age is None) == (self.partition_by is None):
            return ["a freshness policy sets exactly one of max_age or partition_by"]
        if self.max_age is not None:
            if not isinstance(self.max_age, dt.timedelta) or self.max_age <= dt.timedelta(0):
                return [f"freshness max_age must be a positive duration, got {self.max_age!r}"]
            return []
        if not isinstance(self.partition_by, str) or not _CLOCK.match(self.partition_by):
            return [f"freshness partition_by must be a UTC time like '06:00', got {self.partition_by!r}"]
        if getattr(partitioning, "kind", None) != "daily":
            return ["freshness partition_by applies to a daily partitioned dataset only (use max_age)"]
        return []

    def due_partition(self, now: dt.datetime) -> str:
        """The newest daily partition that must exist at `now`: day D is due from D+1 at partition_by."""
        hour, minute = map(int, self.partition_by.split(":"))
        now = now.astimezone(dt.UTC)
        passed = (now.hour, now.minute) >= (hour, minute)
        return (now.date() - dt.timedelta(days=1 if passed else 2)).isoformat()

    def describe(self) -> dict[str, Any]:
        if self.max_age is not None:
            seconds = self.max_age.total_seconds() if isinstance(self.max_age, dt.timedelta) else self.max_age
            return {"max_age_seconds": seconds}
        return {"partition_by": self.partition_by}


def freshness_of(value: Any) -> Freshness | None:
    """A Freshness from a declaration: None, a Freshness, or the settings form {"max_age_hours": 26} /
    {"max_age_seconds": ...} / {"partition_by": "06:00"}. ValueError for another shape."""
    if value is None or isinstance(value, Freshness):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((name, raw),) = value.items()
        if name == "partition_by":
            return Freshness(partition_by=raw)
        if name in ("max_age_hours", "max_age_seconds") and isinstance(raw, int | float) and not isinstance(raw, bool):
            return Freshness(max_age=dt.timedelta(**{name.removeprefix("max_age_"): raw}))
    raise ValueError(
        f"freshness {value!r}: use Freshness(...), or in settings {{'max_age_hours': 26}}, "
        "{'max_age_seconds': ...} or {'partition_by': '06:00'}"
    )


def freshness_state(dataset: Any, latest: Iterable[Materialized], now: dt.datetime) -> str:
    """How fresh `dataset` is at `now`, judged from its newest materializations (the newest by time for
    max_age, the newest partition for partition_by; passing more rows does not change the answer)."""
    latest = list(latest)
    if not latest:
        return "missing"
    policy = dataset.freshness
    if policy is None or policy.problems(dataset.partitioning):
        return "unknown"
    if policy.max_age is not None:
        newest = max(m.at for m in latest)
        return "fresh" if now - newest <= policy.max_age else "stale"
    return "fresh" if max(m.partition for m in latest) >= policy.due_partition(now) else "stale"


def overdue_since(dataset: Any, latest: Iterable[Materialized], now: dt.datetime) -> dt.datetime | None:
    """When a stale `dataset` went past its policy: for max_age, its newest materialization's time plus max_age;
    for partition_by, when the first partition after its newest one fell due (newest day N: day N+1 is due at
    N+2 partition_by). The same instant for as long as the episode lasts (it names the episode: stale.py). None
    unless freshness_state is "stale", and for a newest partition that is not a day (a key written under another
    partitioning)."""
    latest = list(latest)
    if freshness_state(dataset, latest, now) != "stale":
        return None
    policy = dataset.freshness
    if policy.max_age is not None:
        return max(m.at for m in latest) + policy.max_age
    try:
        newest_day = dt.date.fromisoformat(max(m.partition for m in latest))
    except ValueError:
        return None
    hour, minute = map(int, policy.partition_by.split(":"))
    return dt.datetime.combine(newest_day + dt.timedelta(days=2), dt.time(hour, minute), dt.UTC)


def staleness_seconds(dataset: Any, latest: Iterable[Materialized], now: dt.datetime) -> float | None:
    """Seconds `dataset` has been past its policy at `now` (since overdue_since): 0 while fresh; None when that
    cannot be said ("missing": nothing to measure from; "unknown"; a newest partition that is not a day)."""
    latest = list(latest)
    if freshness_state(dataset, latest, now) == "fresh":
        return 0.0
    since = overdue_since(dataset, latest, now)
    return None if since is None else max(0.0, (now - since).total_seconds())
