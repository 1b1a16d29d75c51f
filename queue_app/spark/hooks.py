"""The hooks a Spark run publishes for the layers built on it (the datasets today: datasets/spark_runs.py and
datasets/spark_lineage.py register on them in the datasets app's ready()). spark/runs.py calls them at each step
of a run; it names no layer, and with nothing registered a run is triggered, started and ended as a plain Spark
run. Each is a queue_app.hooks.Hook (registered again by module and name: replaces itself).

- `trigger_checks(spark_job, params)`: when a run is triggered, before anything is written, with the dumped
  parameters; raises SparkParamError to refuse it (a partition that does not fit a produced dataset) or
  RunBlocked (an input the run reads is not usable: its blocking checks failed or still run).
- `start_checks(run, spark_job, ctx) -> reason | None`: when a queued run's attempt begins, before its claim. A
  reason: the run may not start now, and the function has already handed its item back (parked it, the attempt
  not spent) in a transaction of its own; None: it may start.
- `success_outputs(spark_job, params, run_id, app_id) -> [output]`: when an attempt succeeded, outside the
  transaction that records its end (the reads take time: the event log, the outputs' files). The outputs (dicts
  the layer defines; every registered function's, in order) are passed to `succeeded` and `state_changed`;
  SparkParamError: none can be recorded (the run's end is still written, and the error logged).
- `succeeded(outputs, run_id, job)`: inside the transaction that marks the run succeeded, with its job's publish
  and its item's settle, after the row is locked and the reservation checked: all of it commits or none does.
- `state_changed(run, state, outputs, error)`: inside the transaction that moves the run to `state` (starting,
  succeeded, failed, timed out, cancelled); a function sending something out does it on commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..hooks import Hook
from .registry import SparkParamError


class RunBlocked(SparkParamError):
    """A trigger refused by a layer because an input the run reads is not usable: errors["blocked"] says why."""

    def __init__(self, job: str, reason: str) -> None:
        super().__init__(job, {"blocked": reason})


trigger_checks: Hook[Callable[[Any, Mapping[str, Any]], None]] = Hook("spark trigger checks")
start_checks: Hook[Callable[[Any, Any, Any], str | None]] = Hook("spark start checks")
success_outputs: Hook[Callable[[Any, Mapping[str, Any], int, str | None], list[dict]]] = Hook("spark outputs")
succeeded: Hook[Callable[[list[dict], int, str], None]] = Hook("spark run succeeded")
state_changed: Hook[Callable[..., None]] = Hook("spark run state changed")


def check_trigger(spark_job: Any, params: Mapping[str, Any]) -> None:
    for check in trigger_checks:
        check(spark_job, params)


def blocked_reason(run: Any, spark_job: Any, ctx: Any) -> str | None:
    """The first layer's reason not to start the run now (its item already handed back), or None."""
    for check in start_checks:
        reason = check(run, spark_job, ctx)
        if reason:
            return reason
    return None


def outputs_of(spark_job: Any, params: Mapping[str, Any], run_id: int, app_id: str | None) -> list[dict]:
    found: list[dict] = []
    for read in success_outputs:
        found.extend(read(spark_job, params, run_id, app_id))
    return found


def record_success(outputs: list[dict], run_id: int, job: str) -> None:
    for record in succeeded:
        record(outputs, run_id, job)


def changed(run: Any, state: str, *, outputs: Sequence[Mapping[str, Any]] = (), error: str = "") -> None:
    for function in state_changed:
        function(run, state, outputs=outputs, error=error)
