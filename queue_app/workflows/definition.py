"""Workflow definitions: a graph of steps built in code, checked whole before anything is written.

    from queue_app.workflows import Param, workflow

    @workflow("nightly", params=[Param("day", "date", required=True)])
    def nightly(wf, params):
        land = wf.task("shop.land_files", {"day": params["day"]})
        rollup = wf.spark("file_rollup", {...}, after=[land])
        wf.task("shop.notify", after=[rollup], compensate="shop.retract")

A definition is registered next to the tasks (any installed app's `tasks.py`); its builder runs at each start
with the validated parameters. Every problem (unknown task or Spark job, bad Spark parameters, a cycle, a
dependency on a step of another graph, a payload that is not JSON) raises WorkflowDefinitionError naming the
step, before any row exists.
"""

from __future__ import annotations

import datetime as dt
import graphlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..conf import queue_settings
from ..dataset_refs import OnUpdate, on_update_of
from ..engine.errors import InvalidEnqueue
from ..engine.payload import encode_json
from ..events import PUBLISH_TASK
from ..params import Param, ParamError, validate_params
from ..registries import Registry, origin_of
from ..registry import find_task
from ..spark.registry import SparkJobError, get_job
from .models import OnFailure, StepKind


class WorkflowError(Exception):
    """Base class: bad input to a workflow service. The message says what is wrong."""


class WorkflowDefinitionError(WorkflowError, ValueError):
    """The graph a builder made (or was about to make) cannot run."""


class WorkflowConditionError(WorkflowDefinitionError):
    """A bad condition: an unknown run_if rule, or a branch that names a step not directly downstream of it (or
    never names one that is). Reported at startup too, by the system check jobsite.E201."""


class UnknownWorkflow(WorkflowError, LookupError):
    pass


class WorkflowParamError(WorkflowError, ParamError):
    """Bad parameters for a workflow; `errors` maps each bad field to what is wrong with it."""

    def __init__(self, workflow: str, errors: Mapping[str, str]) -> None:
        super().__init__(f"workflow {workflow!r}", errors)


STEP_NAME = re.compile(r"^[^\x00-\x1f]{1,200}$")
# The built-in tasks of the waiting steps (workflows/tasks.py): a sleep's no-op item and an event wait's timeout.
SLEEP_TASK = "queue_app.workflow_sleep"
EVENT_TIMEOUT_TASK = "queue_app.workflow_event_timeout"
APPROVAL_TIMEOUT_TASK = "queue_app.workflow_approval_timeout"
DEADLINE_TASK = "queue_app.workflow_deadline"
# A sub-workflow step's (workflows/children.py): its wait (a delayed item never due, settled by the child's end),
# its start (queued when it becomes ready) and its child's cancel (queued when it is cancelled while waiting).
CHILD_WAIT_TASK = "queue_app.workflow_child_wait"
CHILD_START_TASK = "queue_app.workflow_start_child"
CHILD_CANCEL_TASK = "queue_app.workflow_cancel_child"  # a workflow's or a step's deadline (workflows/deadlines.py)
ON_TIMEOUT = ("fail", "continue")
# An approval without a timeout: its item (its timeout) is due in a century, a time no real wait reaches.
NO_TIMEOUT = 100 * 365.25 * 86400
PERMISSION = re.compile(r"^[A-Za-z_]\w*\.[\w-]{1,100}$")
# Conditions (docs/how-to/workflows.md, Conditions): when a step whose dependencies all ended runs, and the
# branch step's built-in task. The rule is stored in the step's spec ("run_if") and read by the settle trigger
# (workflows/sql.py, queue_app_wf_decide): nothing but these names is evaluated inside the database.
RUN_IF = ("all_succeeded", "all_done", "any_failed", "none_failed")
DEFAULT_RUN_IF = "all_succeeded"
BRANCH_TASK = "queue_app.workflow_branch"
BRANCH_OPS = ("==", "!=", ">", ">=", "<", "<=", "in", "truthy")


@dataclass(frozen=True)
class StepRef:
    """What `wf.task()` / `wf.spark()` return: a handle other steps name in `after=`."""

    graph: Graph = field(repr=False, compare=False)
    name: str


@dataclass
class StepSpec:
    name: str
    kind: str
    target: str
    args: Any
    after: list[str]
    spec: dict[str, Any]
    on_failure: str
    compensate: dict[str, Any] | None
    group: str
    run_if: str = DEFAULT_RUN_IF
    branch: list[str] | None = None  # a branch step: the downstream steps it chooses from


def task_item_spec(task_name: str, payload: Any = None, *, what: str, priority: int = 0) -> dict[str, Any]:
    """What the database needs to enqueue an item of a registered task: {task, queue, max_attempts, payload}.
    Raises WorkflowDefinitionError for an unknown task or a payload that is not JSON. Any delivery mode serves:
    an at-most-once item records its start durably, runs, then settles done (with its result) or dead, and a
    worker lost mid-run leaves it a dead letter, so its step ends like any other (failed, per its policy)."""
    task = find_task(task_name) if isinstance(task_name, str) else None
    if task is None:
        raise WorkflowDefinitionError(f"{what}: unknown task {task_name!r}")
    try:
        encode_json(payload, "payload")
    except InvalidEnqueue as exc:
        raise WorkflowDefinitionError(f"{what}: {exc}") from None
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise WorkflowDefinitionError(f"{what}: priority must be an integer from -100 to 100, not {priority!r}")
    return {
        "task": task.name,
        "queue": task.queue or queue_settings.DEFAULT_QUEUE,
        "max_attempts": task.max_attempts,
        "lease_timeout": task.lease_timeout,
        "priority": priority,
        "payload": payload,
    }


class Graph:
    """The builder a workflow's function receives as `wf`."""

    def __init__(self, name: str, params: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.params = dict(params or {})  # what an event wait's key template is filled from
        self.steps: dict[str, StepSpec] = {}
        self.deadline_spec: dict[str, Any] | None = None  # the workflow's deadline (wf.deadline without a step)

    def _refs(self, after: Iterable[StepRef | str] | StepRef | str, what: str) -> list[str]:
        if isinstance(after, (StepRef, str)):
            after = [after]
        names = []
        for ref in after:
            if isinstance(ref, StepRef):
                if ref.graph is not self:
                    raise WorkflowDefinitionError(
                        f"{what}: depends on step {ref.name!r} of another workflow ({ref.graph.name!r}); a step "
                        "can only wait for steps of its own workflow"
                    )
                names.append(ref.name)
            elif isinstance(ref, str):
                names.append(ref)
            else:
                raise WorkflowDefinitionError(f"{what}: after= takes steps or step names, not {ref!r}")
        return names

    def _add(self, step: StepSpec) -> StepRef:
        if not STEP_NAME.match(step.name):
            raise WorkflowDefinitionError(f"bad step name {step.name!r}: 1-200 characters, no control characters")
        if step.name in self.steps:
            raise WorkflowDefinitionError(
                f"step {step.name!r} is defined twice in workflow {self.name!r}; give one of them name=..."
            )
        if step.on_failure not in OnFailure.values:
            raise WorkflowDefinitionError(
                f"step {step.name!r}: on_failure must be one of {', '.join(OnFailure.values)}, not {step.on_failure!r}"
            )
        if step.run_if not in RUN_IF:
            raise WorkflowConditionError(
                f"step {step.name!r}: run_if must be one of {', '.join(RUN_IF)}, not {step.run_if!r}"
            )
        self.steps[step.name] = step
        return StepRef(self, step.name)

    def _branch_targets(self, targets: Iterable[StepRef | str] | StepRef | str, what: str) -> list[str]:
        names = self._refs(targets, f"{what}: branch")
        if not names or len(set(names)) != len(names):
            raise WorkflowConditionError(f"{what}: a branch names its downstream steps, each once, not {names!r}")
        return names

    def _compensation(self, compensate: str | None, what: str) -> dict[str, Any] | None:
        if compensate is None:
            return None
        spec = task_item_spec(compensate, None, what=f"{what}: compensation")
        spec.pop("payload")
        return spec

    def task(
        self,
        task: str,
        payload: Any = None,
        *,
        name: str | None = None,
        after: Iterable[StepRef | str] | StepRef | str = (),
        on_failure: str = OnFailure.FAIL,
        compensate: str | None = None,
        priority: int = 0,
        group: str | None = None,
        run_if: str = DEFAULT_RUN_IF,
        branch: Iterable[StepRef | str] | None = None,
    ) -> StepRef:
        """A step that runs registered task `task` with `payload`, after the steps in `after` (when they ended as
        `run_if` asks). With `branch` (names of its direct downstream steps) it is a branch: its handler returns
        the names of the ones to run (a name, a list, or {"chosen": [...]}); the others end skipped."""
        name = name or task
        what = f"step {name!r}"
        return self._add(
            StepSpec(
                name=name,
                kind=StepKind.TASK,
                target=task,
                args=payload,
                after=self._refs(after, what),
                spec=task_item_spec(task, payload, what=what, priority=priority),
                on_failure=str(on_failure),
                compensate=self._compensation(compensate, what),
                group=group or name,
                run_if=run_if,
                branch=None if branch is None else self._branch_targets(branch, what),
            )
        )

    def spark(
        self,
        job: str,
        params: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        after: Iterable[StepRef | str] | StepRef | str = (),
        on_failure: str = OnFailure.FAIL,
        compensate: str | None = None,
        timeout: float | None = None,
        group: str | None = None,
        run_if: str = DEFAULT_RUN_IF,
    ) -> StepRef:
        """A step that runs registered Spark job `job` with `params` (validated now) as a SparkRun."""
        from ..spark import runs
        from ..spark.policy import policy_for

        name = name or job
        what = f"step {name!r}"
        try:
            spark_job = get_job(job)
            values = spark_job.validate(params or {})
            seconds = runs.check_timeout(job, timeout)
        except SparkJobError as exc:
            raise WorkflowDefinitionError(f"{what}: {exc}") from None
        dumped = spark_job.dump_params(values)
        # The job's policy decides its item's attempts and priority, as for a run triggered on its own (runs.py).
        policy = policy_for(spark_job)
        spec = task_item_spec(runs.TASK, None, what=what, priority=policy.priority)
        if policy.attempts is not None:
            spec["max_attempts"] = policy.attempts
        spec.update(job=spark_job.name, params=dumped, timeout=seconds)
        return self._add(
            StepSpec(
                name=name,
                kind=StepKind.SPARK,
                target=spark_job.name,
                args=dumped,
                after=self._refs(after, what),
                spec=spec,
                on_failure=str(on_failure),
                compensate=self._compensation(compensate, what),
                group=group or name,
                run_if=run_if,
            )
        )

    def sleep(
        self,
        name: str,
        *,
        seconds: float | None = None,
        until: dt.datetime | None = None,
        after: Iterable[StepRef | str] | StepRef | str = (),
        run_if: str = DEFAULT_RUN_IF,
    ) -> StepRef:
        """A step that waits `seconds` from when it becomes ready, or `until` a time (timezone-aware), holding no
        worker and no connection: its item is a delayed no-op item, and the step ends when a worker leases it."""
        what = f"step {name!r}"
        if (seconds is None) == (until is None):
            raise WorkflowDefinitionError(f"{what}: sleep takes seconds= or until=, one of them")
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 10**9:
                raise WorkflowDefinitionError(f"{what}: seconds must be a number above 0, not {seconds!r}")
            args = {"seconds": float(seconds)}
            extra = {"delay": float(seconds)}
        else:
            if not isinstance(until, dt.datetime) or until.tzinfo is None:
                raise WorkflowDefinitionError(f"{what}: until must be a timezone-aware datetime, not {until!r}")
            args = extra = {"until": until.isoformat()}
        spec = task_item_spec(SLEEP_TASK, args, what=what) | extra
        return self._add(
            StepSpec(
                name,
                StepKind.SLEEP,
                SLEEP_TASK,
                args,
                self._refs(after, what),
                spec,
                OnFailure.FAIL,
                None,
                name,
                run_if,
            )
        )

    def wait_event(
        self,
        name: str,
        *,
        event: str,
        key: str,
        timeout: float,
        on_timeout: str = "fail",
        after: Iterable[StepRef | str] | StepRef | str = (),
        run_if: str = DEFAULT_RUN_IF,
    ) -> StepRef:
        """A step that waits for the event `event` with key `key` (a template over the workflow's parameters:
        "{order}"), sent by workflows.waits.send_event or `workflow send-event`, at most `timeout` seconds; its
        result is the event's payload. Past the timeout it fails (on_timeout="fail") or succeeds with no payload
        ("continue"). An event sent before the step waits is matched when it starts waiting, within the lookback
        (JOBSITE WORKFLOW_EVENT_LOOKBACK)."""
        what = f"step {name!r}"
        if not isinstance(event, str) or not STEP_NAME.match(event):
            raise WorkflowDefinitionError(f"{what}: bad event name {event!r}: 1-200 characters, no control characters")
        try:
            filled = key.format_map(self.params) if isinstance(key, str) else key
        except (KeyError, IndexError, ValueError) as exc:
            raise WorkflowDefinitionError(f"{what}: key template {key!r}: no parameter {exc}") from None
        if not isinstance(filled, str) or not STEP_NAME.match(filled):
            raise WorkflowDefinitionError(f"{what}: bad event key {filled!r}: 1-200 characters, no control characters")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 10**9:
            raise WorkflowDefinitionError(f"{what}: timeout must be a number of seconds above 0, not {timeout!r}")
        if on_timeout not in ON_TIMEOUT:
            raise WorkflowDefinitionError(
                f"{what}: on_timeout must be one of {', '.join(ON_TIMEOUT)}, not {on_timeout!r}"
            )
        args = {"event": event, "key": filled, "timeout": float(timeout), "on_timeout": on_timeout}
        spec = task_item_spec(EVENT_TIMEOUT_TASK, args, what=what) | {
            "delay": float(timeout),
            "event": event,
            "key": filled,
        }
        return self._add(
            StepSpec(
                name, StepKind.EVENT, event, args, self._refs(after, what), spec, OnFailure.FAIL, None, name, run_if
            )
        )

    def approval(
        self,
        name: str,
        *,
        permission: str,
        timeout: float | None = None,
        on_timeout: str = "fail",
        after: Iterable[StepRef | str] | StepRef | str = (),
        run_if: str = DEFAULT_RUN_IF,
    ) -> StepRef:
        """A human step (workflows/approvals.py): it waits for a user holding `permission` ("app_label.codename";
        superusers hold all) to approve it (it succeeds, result {"approved": true, "by", "comment"}) or reject it
        (it fails, and the workflow per its failure policy, compensations included), in the admin's "Pending
        approvals" or with `workflow approve|reject`. With `timeout` seconds and nobody deciding, it fails
        (on_timeout="fail") or succeeds with {"approved": null, "timed_out": true} ("continue"). Its item is its
        timeout, a delayed item; a decision settles it while it is still ready. When it starts waiting the
        `workflow.approval_requested` webhook event is published (its item is queued in that transaction)."""
        from django.contrib.auth.models import Permission

        what = f"step {name!r}"
        if not isinstance(permission, str) or not PERMISSION.match(permission):
            raise WorkflowDefinitionError(f"{what}: permission must be 'app_label.codename', not {permission!r}")
        app_label, codename = permission.split(".", 1)
        if not Permission.objects.filter(content_type__app_label=app_label, codename=codename).exists():
            raise WorkflowDefinitionError(f"{what}: no permission {permission!r} exists")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 10**9
        ):
            raise WorkflowDefinitionError(
                f"{what}: timeout must be None or a number of seconds above 0, not {timeout!r}"
            )
        if on_timeout not in ON_TIMEOUT:
            raise WorkflowDefinitionError(
                f"{what}: on_timeout must be one of {', '.join(ON_TIMEOUT)}, not {on_timeout!r}"
            )
        args = {
            "permission": permission,
            "timeout": None if timeout is None else float(timeout),
            "on_timeout": on_timeout,
        }
        requested = task_item_spec(PUBLISH_TASK, None, what=f"{what}: approval_requested")
        requested.pop("payload")
        spec = task_item_spec(APPROVAL_TIMEOUT_TASK, args, what=what) | {
            "delay": NO_TIMEOUT if timeout is None else float(timeout),
            "permission": permission,
            "requested": requested,
        }
        return self._add(
            StepSpec(
                name,
                StepKind.APPROVAL,
                permission,
                args,
                self._refs(after, what),
                spec,
                OnFailure.FAIL,
                None,
                name,
                run_if,
            )
        )

    def workflow(
        self,
        workflow: str,
        params: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        name: str | None = None,
        after: Iterable[StepRef | str] | StepRef | str = (),
        on_failure: str = OnFailure.FAIL,
        compensate: str | None = None,
        group: str | None = None,
        run_if: str = DEFAULT_RUN_IF,
    ) -> StepRef:
        """A sub-workflow step (workflows/children.py): when ready, it starts registered workflow `workflow` with
        `params` (validated now) as its child, idempotent by `key` (a template over this workflow's parameters,
        "{day}"; default: this workflow's id and the step's name, so a repair finds the same child), and ends
        with it: succeeded with {"workflow_id", "state", "results"} (the child's last steps' results by name)
        when the child succeeds, failed when it fails or is cancelled (then per `on_failure`, compensations
        included). Cancelling this step (the workflow cancelled or failing) cancels the child; a repair of this
        workflow repairs a failed child (a new attempt of the same child, its succeeded steps kept)."""
        name = name or workflow
        what = f"step {name!r}"
        if workflow == self.name:
            raise WorkflowDefinitionError(f"{what}: workflow {self.name!r} cannot start itself as a child")
        try:
            definition = get_workflow(workflow)
        except UnknownWorkflow as exc:
            raise WorkflowDefinitionError(f"{what}: {exc}") from None
        try:
            values = definition.validate(params)
        except WorkflowParamError as exc:
            raise WorkflowDefinitionError(f"{what}: {exc}") from None
        dumped = definition.dump(values)
        if key is not None:
            try:
                key = key.format_map(self.params) if isinstance(key, str) else key
            except (KeyError, IndexError, ValueError) as exc:
                raise WorkflowDefinitionError(f"{what}: key template {key!r}: no parameter {exc}") from None
            if not isinstance(key, str) or not STEP_NAME.match(key):
                raise WorkflowDefinitionError(f"{what}: bad key {key!r}: 1-200 characters, no control characters")
        args = {"workflow": definition.name, "params": dumped, "key": key}
        start = task_item_spec(CHILD_START_TASK, None, what=f"{what}: start")
        start.pop("payload")
        cancel = task_item_spec(CHILD_CANCEL_TASK, None, what=f"{what}: cancel")
        cancel.pop("payload")
        spec = task_item_spec(CHILD_WAIT_TASK, args, what=what) | {
            "delay": NO_TIMEOUT,
            "workflow": definition.name,
            "params": dumped,
            "key": key,
            "start": start,
            "cancel": cancel,
        }
        return self._add(
            StepSpec(
                name=name,
                kind=StepKind.WORKFLOW,
                target=definition.name,
                args=args,
                after=self._refs(after, what),
                spec=spec,
                on_failure=str(on_failure),
                compensate=self._compensation(compensate, what),
                group=group or name,
                run_if=run_if,
            )
        )

    def branch(
        self,
        name: str,
        *,
        on: StepRef | str,
        path: str = "",
        op: str = "==",
        value: Any = None,
        then: Iterable[StepRef | str] | StepRef | str,
        otherwise: Iterable[StepRef | str] | StepRef | str = (),
        after: Iterable[StepRef | str] | StepRef | str = (),
        run_if: str = DEFAULT_RUN_IF,
    ) -> StepRef:
        """A branch step: after `on` (and `after`), it reads `on`'s result at `path` (keys and list indexes joined
        by dots: "order.amount", "rows.0"; "" for the whole result), compares it with `value` by `op` (one of
        BRANCH_OPS; "truthy" takes no value) and chooses the steps of `then` when it holds, else those of
        `otherwise`. Every one of them must depend on this step (its direct downstream), and every step that
        depends on it must be named in one of them. The steps not chosen end skipped, and what depends only on
        skipped steps is skipped too (per each step's run_if). Its result is {"chosen", "value", "matched"}; a
        path that is missing, or a comparison of unlike types, fails it."""
        what = f"step {name!r}"
        [source] = self._refs(on, f"{what}: on") if isinstance(on, (StepRef, str)) else [None]
        if source is None:
            raise WorkflowConditionError(f"{what}: on= takes one step or step name, not {on!r}")
        if op not in BRANCH_OPS:
            raise WorkflowConditionError(f"{what}: op must be one of {', '.join(BRANCH_OPS)}, not {op!r}")
        if not isinstance(path, str):
            raise WorkflowConditionError(f"{what}: path must be a dotted string, not {path!r}")
        chosen = self._branch_targets(then, what)
        other = self._refs(otherwise, f"{what}: otherwise")
        if set(chosen) & set(other) or len(set(other)) != len(other):
            raise WorkflowConditionError(f"{what}: then and otherwise name each step once: {chosen!r}, {other!r}")
        args = {"on": source, "path": path, "op": op, "value": value, "then": chosen, "otherwise": other}
        deps = self._refs(after, what)
        return self._add(
            StepSpec(
                name=name,
                kind=StepKind.TASK,
                target=BRANCH_TASK,
                args=args,
                after=deps + [source] if source not in deps else deps,
                spec=task_item_spec(BRANCH_TASK, args, what=what),
                on_failure=OnFailure.FAIL,
                compensate=None,
                group=name,
                run_if=run_if,
                branch=chosen + other,
            )
        )

    def deadline(
        self,
        step: StepRef | str | None = None,
        *,
        seconds: float | dt.timedelta | None = None,
        at: dt.datetime | None = None,
    ) -> None:
        """A deadline for the workflow (no `step`) or for one step: `seconds` from its start (the workflow's
        start; the step's: when it becomes ready), or `at` a time (timezone-aware, in the future). Past it, what
        of it is waiting or running is cancelled and the workflow fails (compensations run). Its mark is a delayed
        item (workflows/deadlines.py), which changes nothing when the workflow or step has ended."""
        what = "workflow deadline" if step is None else f"deadline of step {getattr(step, 'name', step)!r}"
        spec = deadline_spec(seconds, at, what=what)
        if step is None:
            self.deadline_spec = spec
            return
        name = self._refs(step, what)[0]
        if name not in self.steps:
            raise WorkflowDefinitionError(f"{what}: no such step (define the step first)")
        item = task_item_spec(DEADLINE_TASK, None, what=what)
        item.pop("payload")
        self.steps[name].spec["deadline"] = item | (
            {"delay": spec["seconds"]} if "seconds" in spec else {"until": spec["at"]}
        )

    def order(self) -> list[str]:
        """The steps in dependency order; WorkflowDefinitionError for a cycle, an unknown name, no steps."""
        if not self.steps:
            raise WorkflowDefinitionError(f"workflow {self.name!r} has no steps")
        sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
        for step in self.steps.values():
            for dep in step.after:
                if dep not in self.steps:
                    raise WorkflowDefinitionError(f"step {step.name!r}: depends on unknown step {dep!r}")
                if dep == step.name:
                    raise WorkflowDefinitionError(f"step {step.name!r} depends on itself")
            sorter.add(step.name, *step.after)
        try:
            order = list(sorter.static_order())
        except graphlib.CycleError as exc:
            cycle = " -> ".join(exc.args[1])
            raise WorkflowDefinitionError(f"workflow {self.name!r} has a cycle: {cycle}") from None
        self._conditions(order)
        return order

    def _conditions(self, order: list[str]) -> None:
        """Check the branches (each names exactly its direct downstream steps) and mark, in its spec, every step
        the settle trigger must decide when its dependencies have ended: one with a run_if other than the
        default, or downstream of a branch or of such a step (it may find a dependency skipped). Steps of a graph
        with no condition keep their spec as it was: their settle reads nothing more."""
        down: dict[str, list[str]] = {n: [] for n in self.steps}
        for step in self.steps.values():
            for dep in step.after:
                down[dep].append(step.name)
        for step in self.steps.values():
            if step.branch is None:
                continue
            for target in step.branch:
                if target not in self.steps or step.name not in self.steps[target].after:
                    raise WorkflowConditionError(
                        f"step {step.name!r}: branch names {target!r}, which is not a step directly downstream of "
                        f"it (its downstream steps: {', '.join(sorted(down[step.name])) or 'none'}); give "
                        f"{target!r} after=[{step.name!r}]"
                    )
            unnamed = sorted(set(down[step.name]) - set(step.branch))
            if unnamed:
                raise WorkflowConditionError(
                    f"step {step.name!r}: steps {', '.join(unnamed)} depend on the branch but it never chooses "
                    "them; name them in the branch (or make them depend on a step after it)"
                )
        conditional: set[str] = set()
        for name in order:
            step = self.steps[name]
            if step.run_if != DEFAULT_RUN_IF or any(
                dep in conditional or self.steps[dep].branch is not None for dep in step.after
            ):
                conditional.add(name)
                step.spec["run_if"] = step.run_if
            if step.branch is not None:
                step.spec["branch"] = list(step.branch)


def deadline_spec(seconds: Any, at: Any, *, what: str) -> dict[str, Any]:
    """{"seconds": S} or {"at": ISO time}, checked: a number above 0, or a timezone-aware time not yet past."""
    if (seconds is None) == (at is None):
        raise WorkflowDefinitionError(f"{what}: takes seconds= or at=, one of them")
    if seconds is not None:
        if isinstance(seconds, dt.timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 10**9:
            raise WorkflowDefinitionError(f"{what}: seconds must be a number above 0, not {seconds!r}")
        return {"seconds": float(seconds)}
    if not isinstance(at, dt.datetime) or at.tzinfo is None:
        raise WorkflowDefinitionError(f"{what}: at must be a timezone-aware datetime, not {at!r}")
    if at <= dt.datetime.now(dt.UTC):
        raise WorkflowDefinitionError(f"{what}: {at.isoformat()} is in the past")
    return {"at": at.isoformat()}


Builder = Callable[[Graph, dict[str, Any]], Any]


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    build: Builder = field(repr=False)
    params: tuple[Param, ...] = ()
    description: str = ""
    version: str = ""  # declared (workflow(version=...)); else each run records its graph's fingerprint
    # A data-aware trigger (datasets/triggers.py): started for a partition when these datasets' partition is
    # materialized (datasets/workflow_triggers.py).
    on_update: OnUpdate | None = None

    def validate(self, raw: Mapping[str, Any] | None) -> dict[str, Any]:
        """Typed parameters; WorkflowParamError (a WorkflowError) naming every bad one (unknown, missing, wrong
        type)."""
        values, errors = validate_params(self.params, raw or {}, owner="workflow")
        if errors:
            raise WorkflowParamError(self.name, errors)
        return values

    def dump(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v.isoformat() if isinstance(v, dt.date) else v for k, v in values.items()}

    def graph(self, values: dict[str, Any]) -> tuple[Graph, list[str]]:
        graph = Graph(self.name, self.dump(values))
        self.build(graph, values)
        return graph, graph.order()


# Workflows are registered next to the tasks: every installed app's `tasks.py`.
_workflows: Registry[WorkflowDefinition] = Registry(
    "workflow", app_module="tasks", origin=lambda definition: origin_of(definition.build)
)


def workflow(
    name: str,
    *,
    params: Sequence[Param] = (),
    description: str = "",
    version: str = "",
    on_update: Any = None,
    trigger_mode: str = "all",
    debounce: float = 0,
) -> Callable[[Builder], WorkflowDefinition]:
    """Register `build(wf, params)` as the workflow `name` (its parameters declared like a Spark job's). Each
    run records `version` (1-100 characters), else a fingerprint of the graph it built (workflows/versions.py).
    `on_update` ({dataset: the parameter taking the partition}), `trigger_mode` and `debounce` start it for a
    partition when those datasets' partition is materialized, as for a Spark job (datasets/triggers.py)."""
    names = [p.name for p in params]
    if len(names) != len(set(names)):
        raise ValueError(f"workflow {name!r} declares a parameter twice: {names}")
    if not isinstance(version, str) or len(version) > 100 or not STEP_NAME.match(version or "-"):
        raise ValueError(f"workflow {name!r}: version must be up to 100 characters, not {version!r}")
    trigger = on_update_of(on_update, mode=trigger_mode, debounce=debounce, what=f"workflow {name!r}")

    def register(build: Builder) -> WorkflowDefinition:
        definition = WorkflowDefinition(
            name=name,
            build=build,
            params=tuple(params),
            description=description or (build.__doc__ or "").strip().split("\n")[0],
            version=version,
            on_update=trigger,
        )
        return _workflows.register(name, definition)

    return register


def get_workflow(name: str) -> WorkflowDefinition:
    definition = _workflows.get(name)
    if definition is None:
        known = ", ".join(_workflows.names()) or "(none)"
        raise UnknownWorkflow(
            f"unknown workflow {name!r}{_workflows.did_you_mean(name)}; registered workflows: {known}"
        )
    return definition


def registered_workflows() -> list[WorkflowDefinition]:
    return list(_workflows.entries().values())
