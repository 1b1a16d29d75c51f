"""Per-job run policies: how many runs of a job may run at once across all workers, how often, on which failures
and after what backoff a run is retried, its default timeout, resource profile, queue priority and how long its
history is kept.

A policy is declared with the job (`@spark_job(policy=...)`, `register_script(policy=...)`, a stored script's
policy field) and the `SPARK_JOB_POLICIES` setting overrides it per job name ({"queue_analytics": {...}}).

Concurrency is held by the queue's lease statement, not by worker memory: a run of a job limited to N gets the
ordering key `spark-job:<job>:<lane>` with lane = run id mod N, and the engine hands out the items of one
ordering key one at a time (FIFO, its ordering guarantee). So at most N runs of the job are leased at once
however many workers serve the `spark` queue; a run behind another in its lane stays queued and its page says it
is waiting for that run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from queue_app.conf import queue_settings
from queue_app.engine import backoff_seconds

RETRY_KINDS = ("failed", "timed_out")
MAX_BACKOFF = 86_400.0  # a day: a longer wait between attempts is a schedule, not a backoff
# Named resource profiles (Spark conf); the RESOURCE_PROFILES setting adds or replaces profiles.
BUILTIN_PROFILES: dict[str, dict[str, str]] = {
    "small": {"spark.driver.memory": "1g", "spark.executor.memory": "1g", "spark.executor.cores": "1"},
    "medium": {"spark.driver.memory": "2g", "spark.executor.memory": "2g", "spark.executor.cores": "2"},
    "large": {"spark.driver.memory": "4g", "spark.executor.memory": "8g", "spark.executor.cores": "4"},
}


class PolicyError(ValueError):
    """A policy field is not acceptable; the message names it."""


@dataclass(frozen=True)
class SparkPolicy:
    max_concurrent: int | None = None  # runs of this job at once, across all workers (None: no limit)
    attempts: int | None = None  # attempts in all, a lost worker's included (None: the queue's default)
    retry_on: tuple[str, ...] = ("failed",)  # which ends are retried while attempts remain: failed, timed_out
    # Backoff before a retry: base * 2^(attempt-1) with the queue's jitter, at most backoff_max seconds (None:
    # the JOBSITE_BACKOFF_BASE / JOBSITE_BACKOFF_MAX settings).
    backoff_base: float | None = None
    backoff_max: float | None = None
    timeout: float | None = None  # default timeout of a run (seconds; a trigger may give its own)
    resource_profile: str = ""  # a named profile: its Spark conf goes under the job's own
    priority: int = 0  # queue priority of the run's item (higher first)
    keep_days: int | None = None  # finished runs older than this are pruned with their event logs (None: kept)

    def __post_init__(self) -> None:
        def whole(name: str, low: int, high: int, *, optional: bool) -> None:
            value = getattr(self, name)
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PolicyError(f"{name} must be a whole number from {low} to {high}, got {value!r}")

        whole("max_concurrent", 1, 1000, optional=True)
        whole("attempts", 1, 20, optional=True)
        whole("priority", -1000, 1000, optional=False)
        whole("keep_days", 1, 3650, optional=True)
        if not isinstance(self.retry_on, tuple) or not set(self.retry_on) <= set(RETRY_KINDS):
            raise PolicyError(f"retry_on must list some of {', '.join(RETRY_KINDS)}, got {self.retry_on!r}")
        if self.timeout is not None and (
            isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float) or not self.timeout > 0
        ):
            raise PolicyError(f"timeout must be a number of seconds > 0, got {self.timeout!r}")
        for name in ("backoff_base", "backoff_max"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_BACKOFF
            ):
                raise PolicyError(f"{name} must be a number of seconds from 0 to {MAX_BACKOFF}, got {value!r}")
        if self.resource_profile and self.resource_profile not in profiles():
            raise PolicyError(
                f"resource_profile {self.resource_profile!r} is not one of {', '.join(sorted(profiles()))}"
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> SparkPolicy:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise PolicyError("a policy must be a mapping")
        known = {f.name for f in fields(cls)}
        if unknown := set(raw) - known:
            raise PolicyError(f"unknown policy keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        values = dict(raw)
        if "retry_on" in values:
            values["retry_on"] = tuple(values["retry_on"]) if isinstance(values["retry_on"], list | tuple) else None
        return cls(**values)

    def merged(self, override: Mapping[str, Any]) -> SparkPolicy:
        known = {f.name: getattr(self, f.name) for f in fields(self)}
        return SparkPolicy.from_mapping({**known, **override})

    def conf(self) -> dict[str, str]:
        return dict(profiles().get(self.resource_profile, {})) if self.resource_profile else {}

    def ordering_key(self, job: str, run_id: int) -> str | None:
        """The run's lane, when the job's concurrency is limited."""
        if self.max_concurrent is None:
            return None
        return f"spark-job:{job}:{run_id % self.max_concurrent}"

    def retries(self, outcome: str) -> bool:
        return outcome in self.retry_on

    def retry_in(self, attempt: int) -> float | None:
        """Seconds before the attempt after `attempt` failed, by this job's backoff; None when the job sets
        neither base nor cap (the spark task's own backoff from the settings then applies)."""
        if self.backoff_base is None and self.backoff_max is None:
            return None
        return backoff_seconds(attempt, base=self.backoff_base, cap=self.backoff_max)


def profiles() -> dict[str, dict[str, str]]:
    return {**BUILTIN_PROFILES, **dict(queue_settings.SPARK_RESOURCE_PROFILES)}


def policy_for(job: Any) -> SparkPolicy:
    """The job's declared policy with the `SPARK_JOB_POLICIES` setting's override for its name."""
    declared = getattr(job, "policy", None) or SparkPolicy()
    override = dict(queue_settings.SPARK_JOB_POLICIES).get(job.name)
    return declared.merged(override) if override else declared
