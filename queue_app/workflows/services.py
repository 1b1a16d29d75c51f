"""One function per workflow state change (start, fan out, cancel, repair, batch, backfill), shared by code, the
admin, the CLI and the worker. Each validates everything first and writes in one transaction (nested in the
caller's, so a workflow started inside `transaction.atomic()` is rolled back with it).

Moving a workflow forward once it runs is not done here: the triggers on queue items (queue_app/workflows/sql.py)
do it in the transaction that settles each step's item.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from django.db.models import F

from .. import engine, services
from ..conf import queue_settings
from ..engine import tracing
from ..engine.alias import atomic, queue_db
from ..engine.db import cursor
from ..engine.errors import InvalidEnqueue
from ..engine.payload import encode_json
from ..hooks import why_held
from ..registry import Context
from ..spark.registry import SparkJobError, get_job
from . import children, deadlines, rebuild, spans, sql, versions
from . import hooks as workflow_hooks
from .definition import (
    STEP_NAME,
    Graph,
    UnknownWorkflow,
    WorkflowDefinitionError,
    WorkflowError,
    get_workflow,
    task_item_spec,
)
from .models import (
    WORKFLOW_FINAL_STATES,
    WORKFLOW_OPEN_STATES,
    OnFailure,
    StepDependency,
    StepKind,
    StepState,
    Workflow,
    WorkflowKind,
    WorkflowState,
    WorkflowStep,
    default_max_attempts,
)

FINISHED_TASK = "queue_app.workflow_finished"
MAX_BACKFILL_PARTITIONS = 366  # more only with force=True (--force)
MAX_CONCURRENCY = 1000


class WorkflowNotRunning(WorkflowError):
    """A step tried to add steps to a workflow that is no longer running (failed, cancelled, repaired)."""


def _callbacks(extra: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    finished = task_item_spec(FINISHED_TASK, None, what="workflow callback")
    return {"finished": finished, **(extra or {})}


def _enqueue(ids: list[int], channel: str, using: str | None = None) -> None:
    if ids:
        with cursor(using) as cur:
            cur.execute(sql.WORKFLOW_ENQUEUE, {"ids": ids, "channel": channel})


def _ensure_queues(specs: Iterable[dict[str, Any]], using: str | None = None) -> None:
    for queue in {spec["queue"] for spec in specs if spec}:
        engine.ensure_queue(queue, using=using)


def _item_specs(steps: list[Any], callbacks: dict[str, Any]) -> list[dict[str, Any]]:
    """The specs of every item a workflow of these steps may queue: their queues are made before it is written."""
    return (
        [s.spec for s in steps]
        + [s.compensate for s in steps if s.compensate]
        + [s.spec["requested"] for s in steps if "requested" in s.spec]  # an approval's webhook event item
        + [s.spec[k] for s in steps for k in ("start", "cancel") if k in s.spec]  # a sub-workflow's start, cancel
        + [s.spec["deadline"] for s in steps if "deadline" in s.spec]  # a step's deadline item
        + list(callbacks.values())
    )


# What a step row takes from its definition: a checked StepSpec when a workflow starts, the earlier attempt's
# row when a repair copies it.
_DEFINED = ("name", "group", "kind", "target", "args", "spec", "on_failure", "compensate")


def _step_row(workflow_id: int, attempt: int, source: Any, **fields: Any) -> WorkflowStep:
    return WorkflowStep(workflow_id=workflow_id, attempt=attempt, **{f: getattr(source, f) for f in _DEFINED}, **fields)


def _create(
    name: str,
    kind: str,
    params: dict[str, Any],
    graph: Graph,
    order: list[str],
    started_by: str,
    *,
    callbacks: dict[str, Any] | None = None,
    order_edges: Iterable[tuple[str, str]] = (),
    key: tuple[str, float | None] | None = None,
    version: str | None = None,
    deadline: dict[str, Any] | None = None,
    using: str | None = None,
    start_checks: Callable[[], None] | None = None,
    queues_ready: bool = False,
    claimed: int | None = None,
) -> Workflow:
    """Write a checked graph: the workflow, its steps and edges, and the items of the steps with nothing to wait
    for, in one transaction. With `key` (key, window in seconds or None), the key is claimed first: held by
    another workflow, that one is returned and nothing is written. The returned row's `created` says which.
    `version` (a declared one, "" for the graph's fingerprint; None: not recorded, a backfill's or a batch's)
    is recorded with the graph's shape (workflows/versions.py); `deadline` (else the graph's, wf.deadline) is
    armed (workflows/deadlines.py): a time already past is an error, nothing written. With tracing on, the start
    is a span the workflow's row keeps the context of: every step's item carries it, so the workflow is one trace
    (engine/tracing.py). `start_checks()` (a layer's, workflows/hooks.start_checks) runs first in that
    transaction: what it raises writes nothing, and what it locks stays held until the workflow is written."""
    options = dict(
        callbacks=callbacks,
        order_edges=order_edges,
        key=key,
        version=version,
        deadline=deadline,
        using=using,
        start_checks=start_checks,
        queues_ready=queues_ready,
        claimed=claimed,
    )
    if tracing.enabled:
        with spans.workflow_start(name, kind) as span:
            workflow = _write(
                name, kind, params, graph, order, started_by, trace_context=tracing.traceparent(span), **options
            )
            span.set_attribute("jobsite.workflow_id", workflow.id)
            span.set_attribute("jobsite.workflow.created", bool(workflow.created))
            return workflow
    return _write(name, kind, params, graph, order, started_by, trace_context=None, **options)


def _write(
    name: str,
    kind: str,
    params: dict[str, Any],
    graph: Graph,
    order: list[str],
    started_by: str,
    *,
    callbacks: dict[str, Any] | None,
    order_edges: Iterable[tuple[str, str]],
    key: tuple[str, float | None] | None,
    version: str | None,
    deadline: dict[str, Any] | None,
    using: str,
    trace_context: str | None,
    start_checks: Callable[[], None] | None,
    queues_ready: bool,
    claimed: int | None,
) -> Workflow:
    deadline = deadline or graph.deadline_spec
    deadline_at = deadlines.due(deadline)
    shape = fp = None
    if version is not None:
        shape = versions.shape(graph)
        version, fp = versions.version_of(version, shape)
    steps = [graph.steps[n] for n in order]
    order_edges = list(order_edges)
    waits = {s.name: len(s.after) for s in steps}
    for _, down in order_edges:
        waits[down] += 1
    channel = queue_settings.NOTIFY_CHANNEL
    callbacks = _callbacks(callbacks)
    if not queues_ready:
        _ensure_queues(_item_specs(steps, callbacks), using)
    # A caller that claimed the key (claimed: the id it drew) did so in a savepoint of its own, which this joins.
    with atomic(using, savepoint=claimed is None):
        if start_checks is not None:  # first: what they lock is held until the workflow is written
            start_checks()
        workflow_id = claimed
        if key is not None and claimed is None:
            with cursor(using) as cur:
                claim = {"name": name, "key": key[0], "window": key[1]}
                cur.execute(sql.WORKFLOW_CLAIM_KEY, claim)
                row = cur.fetchone()
                if row is None:
                    cur.execute(sql.WORKFLOW_KEY_HOLDER, claim)
                    first = Workflow.objects.using(queue_db(using)).get(id=cur.fetchone()[0])
                    first.created = False
                    return first
                workflow_id = row[0]
        workflow = Workflow.objects.using(queue_db(using)).create(
            id=workflow_id,
            name=name,
            kind=kind,
            params=params,
            started_by=(started_by or "")[:150],
            steps_total=len(steps),
            steps_open=len(steps),
            callbacks=callbacks,
            channel=channel,
            default_max_attempts=default_max_attempts(),
            version=version or "",
            deadline=deadline,
            deadline_at=deadline_at,
            trace_context=trace_context,
        )
        if shape is not None:
            versions.record(name, version, fp, shape, using)
        deadlines.arm(workflow.id, 1, deadline_at, using)
        first = [s for s in steps if s.kind == StepKind.WORKFLOW and waits[s.name] == 0]
        linked = _start_children(workflow.id, first, using) if first else {}
        rows = WorkflowStep.objects.using(queue_db(using)).bulk_create(
            [_step_row(workflow.id, 1, s, pending=waits[s.name], child_workflow_id=linked.get(s.name)) for s in steps],
            batch_size=2000,
        )
        ids = {row.name: row.id for row in rows}
        StepDependency.objects.using(queue_db(using)).bulk_create(
            [StepDependency(upstream_id=ids[up], downstream_id=ids[s.name]) for s in steps for up in s.after]
            + [
                StepDependency(upstream_id=ids[up], downstream_id=ids[down], order_only=True)
                for up, down in order_edges
            ],
            batch_size=5000,
        )
        _enqueue([ids[n] for n in order if waits[n] == 0], channel, using)
        if linked:  # a child that ended already (nothing of it left to run) ends its step now
            with cursor(using) as cur:
                cur.execute(sql.WORKFLOW_CHILDREN_SETTLE, {"ids": list(linked.values())})
    workflow.created = True
    return workflow


def _start_children(workflow_id: int, steps: list[Any], using: str | None) -> dict[str, int]:
    """Start the children of a starting workflow's sub-workflow steps with nothing to wait for, in its start
    transaction (workflows/children.py): each made by its key as start() would, in a savepoint of its own.
    Returns {step name: child id} of the children made here; a step left out (its key held by another workflow,
    its definition not loaded in this process, its parameters refused, its builder raising, nested too deep)
    queues its start item when it becomes ready, whose handler finds, repairs or fails as it does for any step."""
    depth = children.writing_depth() + 1
    if depth >= children.MAX_DEPTH:
        return {}
    linked = {}
    for step in steps:
        try:
            with atomic(using):
                definition = get_workflow(step.spec["workflow"])
                values = definition.validate(step.spec.get("params") or {})
                graph, order = definition.graph(values)
                with children.writing_at(depth):  # its own first sub-workflow steps start theirs here too
                    child = _create(
                        definition.name,
                        WorkflowKind.WORKFLOW,
                        definition.dump(values),
                        graph,
                        order,
                        f"workflow {workflow_id}",
                        key=_start_key(children.child_key(workflow_id, step.name, step.spec), None),
                        version=definition.version,
                        using=using,
                    )
        except Exception:  # noqa: BLE001, S112  (the start item meets it again and fails the step with why)
            continue
        if child.created:
            linked[step.name] = child.id
    return linked


def start_graph(graph: Graph, *, started_by: str = "", deadline: Any = None, using: str | None = None) -> Workflow:
    """Start a graph built in code (not a registered workflow): `Graph(name)`, `.task()`, `.spark()`, then this.
    Checked like a registered one's graph before anything is written. Its version is its graph's fingerprint.
    `deadline`: as start's."""
    spec = deadlines.parse(deadline)
    order = graph.order()
    return _create(
        graph.name, WorkflowKind.WORKFLOW, {}, graph, order, started_by, version="", deadline=spec, using=using
    )


def _start_key(key: Any, window: Any) -> tuple[str, float | None] | None:
    if key is None:
        if window is not None:
            raise WorkflowError("a key window needs a key")
        return None
    if not isinstance(key, str) or not STEP_NAME.match(key):
        raise WorkflowError(f"bad key {key!r}: 1-200 characters, no control characters")
    if isinstance(window, dt.timedelta):
        window = window.total_seconds()
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0):
        raise WorkflowError(f"key window must be a number of seconds above 0, not {window!r}")
    return key, None if window is None else float(window)


def start(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    started_by: str = "",
    key: str | None = None,
    key_window: float | dt.timedelta | None = None,
    deadline: float | dt.timedelta | dt.datetime | None = None,
) -> Workflow:
    """Start registered workflow `name`. Raises UnknownWorkflow, WorkflowError (bad parameters, a bad key) or
    WorkflowDefinitionError (the graph its builder made cannot run) before anything is written.

    With `key`, idempotent: while a workflow of this name started with the same key exists (or, with
    `key_window` seconds, until that long after it started), another start returns it and writes nothing, also
    under concurrent starters (a unique claim, WorkflowStartKey). The returned row's `created` is True for a new
    workflow, False for the one the key already named.

    `deadline` (seconds from now, or a timezone-aware time; else the definition's `wf.deadline`, if any): past
    it, what is waiting or running is cancelled and the workflow fails (workflows/deadlines.py). A time already
    past is a WorkflowDefinitionError, nothing written. Each run records its definition's version."""
    definition = get_workflow(name)
    claim = _start_key(key, key_window)
    spec = deadlines.parse(deadline)
    return start_prepared(prepare(definition, params), started_by=started_by, key=claim, deadline=spec)


class Prepared(NamedTuple):
    """A registered workflow's run checked and built, not written yet (prepare(), then start_prepared())."""

    definition: Any
    params: dict[str, Any]  # as stored (dumped)
    graph: Graph
    order: list[str]


def prepare(definition: Any, params: Mapping[str, Any] | None) -> Prepared:
    """Validate `params` and build the graph (WorkflowError, WorkflowDefinitionError as start() raises them)."""
    values = definition.validate(params)
    graph, order = definition.graph(values)
    return Prepared(definition, definition.dump(values), graph, order)


def queues_of(prepared: Prepared) -> list[str]:
    """The queues its items may go to, which its start makes first (a caller that made them passes
    queues_ready)."""
    steps = [prepared.graph.steps[n] for n in prepared.order]
    return sorted({spec["queue"] for spec in _item_specs(steps, _callbacks()) if spec})


def start_prepared(
    prepared: Prepared,
    *,
    started_by: str = "",
    key: tuple[str, float | None] | None = None,
    deadline: dict[str, Any] | None = None,
    queues_ready: bool = False,
    claimed: int | None = None,
) -> Workflow:
    """start() of a prepared run: `key` and `deadline` as _start_key and deadlines.parse return them.
    `queues_ready`: the caller made queues_of(prepared); `claimed`: it claimed `key` for this id (sql
    WORKFLOW_CLAIM_KEY's row), in a savepoint of its own that the start joins (what fails undoes the claim)."""
    definition, dumped = prepared.definition, prepared.params

    def start_checks() -> None:  # a layer's (workflows/hooks.start_checks), in the transaction that writes it
        for check in workflow_hooks.start_checks:
            check(definition, dumped)

    return _create(
        definition.name,
        WorkflowKind.WORKFLOW,
        dumped,
        prepared.graph,
        prepared.order,
        started_by,
        key=key,
        version=definition.version,
        deadline=deadline,
        start_checks=start_checks,
        queues_ready=queues_ready,
        claimed=claimed,
    )


# -- from inside a running step -------------------------------------------------------------------------------


def current_step(ctx: Context) -> WorkflowStep:
    step = WorkflowStep.objects.filter(item_id=ctx.item_id).order_by("-id").first()
    if step is None:
        raise WorkflowError(f"item {ctx.item_id} is not a workflow step")
    return step


def _upstream_of(step: WorkflowStep) -> dict[str, Any]:
    ups = StepDependency.objects.filter(downstream_id=step.id, order_only=False).values("upstream_id")
    return dict(WorkflowStep.objects.filter(id__in=ups).order_by("id").values_list("name", "result"))


def upstream(ctx: Context) -> dict[str, Any]:
    """The results of the steps this step waited for, by step name: a task's return value, a Spark run's
    metrics. Call it from a step's handler."""
    return _upstream_of(current_step(ctx))


def spark_upstream(run_id: int | None = None) -> dict[str, Any]:
    """`upstream` for a Spark step: call it from a Spark job's function (`func(spark, params)`, in the run's
    child process) to read the results of the steps the run's step waited for, by step name. The run is the
    child's own (the child names it in its environment from its --run-id) unless `run_id` is given. Empty when
    the run is not a workflow step."""
    from ..spark.models import SparkRun
    from ..spark.protocol import RUN_ID_ENV

    if run_id is None:
        run_id = int(os.environ[RUN_ID_ENV])
    item_id = SparkRun.objects.filter(id=run_id).values_list("item_id", flat=True).first()
    step = WorkflowStep.objects.filter(item_id=item_id, spark_run_id=run_id).order_by("-id").first()
    return {} if item_id is None or step is None else _upstream_of(step)


def fan_out(
    ctx: Context,
    task: str,
    payloads: Mapping[str, Any],
    *,
    group: str | None = None,
    on_failure: str = OnFailure.FAIL,
    compensate: str | None = None,
) -> list[int]:
    """From a running step's handler: add one step of `task` per entry of `payloads` ({key: payload}), named
    `group[key]` (group defaults to the task name; in a backfill, prefixed by the parent's day). They start at
    once; every step waiting for this one now waits for them too (fan-in). Idempotent: keys added by an
    earlier attempt of this step are not added again. Returns the ids of the steps added now."""
    group = group or task
    spec = task_item_spec(task, None, what=f"fan-out {group!r}")
    if on_failure not in OnFailure.values:
        raise WorkflowDefinitionError(f"fan-out {group!r}: on_failure must be one of {', '.join(OnFailure.values)}")
    comp = None
    if compensate is not None:
        comp = task_item_spec(compensate, None, what=f"fan-out {group!r}: compensation")
        comp.pop("payload")
    encoded = {}
    for key, payload in payloads.items():
        try:
            encoded[key] = encode_json(payload, "payload")
        except InvalidEnqueue as exc:
            raise WorkflowDefinitionError(f"fan-out {group!r}[{key}]: {exc}") from None
    step = current_step(ctx)
    with atomic():
        workflow = Workflow.objects.select_for_update().get(id=step.workflow_id)
        step.refresh_from_db(fields=["state", "attempt"])
        if workflow.state != WorkflowState.RUNNING or step.attempt != workflow.attempt or step.state != "queued":
            raise WorkflowNotRunning(f"workflow {workflow.id} is {workflow.state}: step {step.name!r} cannot fan out")
        # A backfill's steps are named "<day> <name>" and grouped by day: what one of them adds belongs to its day.
        partition = step.group if workflow.kind == WorkflowKind.BACKFILL else None
        names = [f"{partition} {group}[{key}]" if partition else f"{group}[{key}]" for key in encoded]
        _ensure_queues([spec] + ([comp] if comp else []))
        with cursor() as cur:
            cur.execute(
                sql.WORKFLOW_FAN_OUT,
                {
                    "workflow_id": workflow.id,
                    "attempt": workflow.attempt,
                    "group": partition or group,
                    "task": spec["task"],
                    "spec": encode_json(spec, "spec"),
                    "on_failure": str(on_failure),
                    "compensate": None if comp is None else encode_json(comp, "compensate"),
                    "parent_id": step.id,
                    "names": names,
                    "payloads": list(encoded.values()),
                    "channel": workflow.channel,
                    # The new steps' items: children of this step's attempt (else the workflow's start span).
                    "trace_context": tracing.traceparent() if tracing.enabled else None,
                },
            )
            ids = list(cur.fetchone()[0])
    return ids


# -- cancel, repair -------------------------------------------------------------------------------------------


def _finish(workflow_id: int) -> None:
    with cursor() as cur:
        cur.execute(sql.WORKFLOW_FINISH, {"workflow_id": workflow_id})


def cancel(workflow_id: int, *, actor: str = "") -> bool:
    """Cancel a running workflow: steps not started are cancelled, queued items cancelled, running Spark runs
    stopped, running tasks asked to stop (their reservation is revoked: `ctx.extend_lease` raises
    StaleReservation and their outcome is not recorded). No compensations run. False when it already ended (or
    is being cancelled); WorkflowError when there is no such workflow."""
    with atomic():
        workflow = Workflow.objects.select_for_update().filter(id=workflow_id).first()
        if workflow is None:
            raise WorkflowError(f"no workflow {workflow_id}")
        if workflow.state not in WORKFLOW_OPEN_STATES or workflow.state == WorkflowState.CANCELLING:
            return False
        current = WorkflowStep.objects.filter(workflow_id=workflow.id, attempt=workflow.attempt)
        waiting = current.filter(state=StepState.WAITING).update(
            state=StepState.CANCELLED, error=f"cancelled by {actor or '?'}", finished_at=dt.datetime.now(dt.UTC)
        )
        Workflow.objects.filter(id=workflow.id).update(
            state=WorkflowState.CANCELLING, steps_open=F("steps_open") - waiting, error=f"cancelled by {actor or '?'}"
        )
        items = list(current.filter(state=StepState.QUEUED, item_id__isnull=False).values_list("item_id", flat=True))
        services.cancel_items(items, actor=actor)  # each cancelled item settles its step (the trigger)
        _finish(workflow.id)  # ends it now when nothing was running
    return True


def _ended_attempt(workflow: Workflow) -> tuple[list[WorkflowStep], list[StepDependency]]:
    rows = list(WorkflowStep.objects.filter(workflow_id=workflow.id, attempt=workflow.attempt).order_by("id"))
    edges = list(StepDependency.objects.filter(downstream_id__in=[s.id for s in rows]))
    return rows, edges


def _onto_current(workflow: Workflow) -> tuple[Graph, list[str], str, dict[str, Any]]:
    """The workflow's current definition, built with its parameters (versions.current), for a rebuild."""
    if workflow.kind != WorkflowKind.WORKFLOW:
        raise WorkflowError(
            f"workflow {workflow.id} is a {workflow.kind}: only a registered workflow has a current definition"
        )
    graph, order, version, shape = versions.current(workflow)
    _ensure_queues(
        [s.spec for s in graph.steps.values()]
        + [s.compensate for s in graph.steps.values() if s.compensate]
        + [s.spec[k] for s in graph.steps.values() for k in ("requested", "deadline", "start", "cancel") if k in s.spec]
    )
    return graph, order, version, shape


def _run(workflow: Workflow, attempt: int, rows: list[WorkflowStep]) -> None:
    """Start attempt `attempt` just written (a repair's or a fork's, workflows/rebuild.py): the steps with nothing
    to wait for are decided first (conditional ones, workflows/sql.py queue_app_wf_decide: a branch kept from the
    earlier attempt still skips the steps it did not choose, and what a skip leaves with nothing to wait for is
    decided in turn), the others enqueued; then the workflow ends at once if nothing is left open."""
    roots = [row.id for row in rows if row.state == StepState.WAITING and row.pending == 0]
    if roots:
        with cursor() as cur:
            cur.execute(sql.WORKFLOW_DECIDE_AND_ENQUEUE, {"ids": roots, "channel": workflow.channel})
    _finish(workflow.id)


def repair(workflow_id: int, *, actor: str = "", onto_current: bool = False) -> Workflow:
    """A new attempt of a failed or cancelled workflow: the steps that failed or were cancelled (or whose work
    was compensated) run again with everything downstream of them; steps that succeeded keep their results and
    are not run, skipped ones stay skipped (a branch keeps its choice) unless something upstream of them runs
    again. The earlier attempts' rows stay as they were.

    It re-runs the stored graph (the one the workflow started with), unless `onto_current`: then the new attempt
    is the definition as the code has it now (built with the workflow's parameters), a step kept only when it
    succeeded with the same definition, and the workflow records that version (workflows/rebuild.py). A
    deadline is armed again: a duration from now, a time only when it has not passed."""
    with atomic():
        workflow = Workflow.objects.select_for_update().filter(id=workflow_id).first()
        if workflow is None:
            raise WorkflowError(f"no workflow {workflow_id}")
        if workflow.state not in (WorkflowState.FAILED, WorkflowState.CANCELLED):
            raise WorkflowError(
                f"workflow {workflow_id} is {workflow.state}: only a failed or cancelled one can be repaired"
            )
        version = workflow.version
        rows, edges = _ended_attempt(workflow)
        if onto_current:
            graph, order, version, shape = _onto_current(workflow)
            planned = rebuild.plan(rows, edges, graph=graph, order=order)
            versions.record(workflow.name, version, versions.fingerprint(shape), shape)
        else:
            planned = rebuild.plan(rows, edges)
        attempt = workflow.attempt + 1
        new_rows = rebuild.write(planned, workflow.id, attempt)
        deadline_at = deadlines.due(workflow.deadline, strict=False)
        Workflow.objects.filter(id=workflow.id).update(
            attempt=attempt,
            default_max_attempts=default_max_attempts(),  # its new items are made now, under today's setting
            state=WorkflowState.RUNNING,
            steps_total=len(new_rows),
            steps_open=planned.waiting,
            steps_failed=0,
            finished_at=None,
            error="",
            version=version,
            deadline_at=deadline_at,
        )
        deadlines.arm(workflow.id, attempt, deadline_at)
        _run(workflow, attempt, new_rows)
    workflow.refresh_from_db()
    return workflow


def fork(workflow_id: int, from_step: str, *, onto_current: bool = False, actor: str = "") -> Workflow:
    """A new workflow from a finished one, re-run from step `from_step`: that step and everything downstream of
    it run again (and any step that did not succeed, with what is downstream of it); every other step is
    copied succeeded with its result (and item), so the steps upstream of `from_step` keep their results. On
    the stored graph (the one the finished workflow ran), or `onto_current`: the definition as the code has it
    now, built with the same parameters (a step kept only when its definition is unchanged). The new workflow
    names its source (`forked_from`, `fork_step`) and takes its parameters, callbacks and deadline (a duration
    from now; a time only when it has not passed). WorkflowError, nothing written: an unknown workflow, one
    not finished, a step it does not have."""
    with atomic():
        source = Workflow.objects.select_for_update().filter(id=workflow_id).first()
        if source is None:
            raise WorkflowError(f"no workflow {workflow_id}")
        if source.state not in WORKFLOW_FINAL_STATES:
            raise WorkflowError(f"workflow {workflow_id} is {source.state}: only a finished one can be forked")
        if not isinstance(from_step, str) or not from_step:
            raise WorkflowError("fork needs the step to re-run from (--from STEP)")
        rows, edges = _ended_attempt(source)
        where = f"workflow {source.id} ({source.name})"
        version, shape = source.version, None
        if onto_current:
            graph, order, version, shape = _onto_current(source)
            planned = rebuild.plan(rows, edges, graph=graph, order=order, from_step=from_step, where=where)
        else:
            planned = rebuild.plan(rows, edges, from_step=from_step, where=where)
        deadline_at = deadlines.due(source.deadline, strict=False)
        workflow = Workflow.objects.create(
            name=source.name,
            kind=source.kind,
            params=source.params,
            started_by=(actor or "")[:150],
            steps_total=len(planned.rows),
            steps_open=planned.waiting,
            callbacks=source.callbacks,
            channel=source.channel,
            default_max_attempts=default_max_attempts(),
            version=version,
            forked_from=source.id,
            fork_step=from_step,
            deadline=source.deadline,
            deadline_at=deadline_at,
        )
        if shape is not None:
            versions.record(workflow.name, version, versions.fingerprint(shape), shape)
        new_rows = rebuild.write(planned, workflow.id, 1)
        deadlines.arm(workflow.id, 1, deadline_at)
        _run(workflow, 1, new_rows)
    workflow.refresh_from_db()
    return workflow


# -- batches --------------------------------------------------------------------------------------------------


def batch(
    task: str,
    payloads: Iterable[Any],
    *,
    on_done: str | None = None,
    on_dead: str | None = None,
    callback_payload: Any = None,
    started_by: str = "",
) -> Workflow:
    """Enqueue N items of `task` as one batch: `on_done` (a task) runs once when every item is done, `on_dead`
    once when the first item dies (the others keep running). Each callback gets `callback_payload` (a dict)
    plus {"workflow_id", "state"}. A batch is a workflow of kind "batch": see its status like any other."""
    graph = Graph(f"batch {task}")
    for i, payload in enumerate(payloads):
        graph.task(task, payload, name=f"{task}[{i}]", group=task, on_failure=OnFailure.CONTINUE)
    extra = {}
    for key, target in (("done", on_done), ("dead", on_dead)):
        if target is not None:
            if callback_payload is not None and not isinstance(callback_payload, dict):
                raise WorkflowDefinitionError("callback_payload must be a JSON object")
            extra[key] = task_item_spec(target, callback_payload or {}, what=f"batch on_{key}")
    order = graph.order()
    return _create(graph.name, WorkflowKind.BATCH, {"task": task}, graph, order, started_by, callbacks=extra)


# -- backfills ------------------------------------------------------------------------------------------------


def _partition_param(job: str) -> tuple[str, str]:
    """(kind, date parameter) of what a backfill runs: a workflow, a Spark job or a task (whose payload gets
    "day")."""
    try:
        dates = [p.name for p in get_workflow(job).params if p.type == "date"]
        kind = "workflow"
    except UnknownWorkflow:
        try:
            dates = [p.name for p in get_job(job).params if p.type == "date"]
            kind = "spark"
        except SparkJobError:
            task_item_spec(job, None, what=f"backfill of {job!r} (not a workflow, Spark job or task)")
            return "task", "day"
    if "day" in dates:
        return kind, "day"
    if len(dates) == 1:
        return kind, dates[0]
    raise WorkflowDefinitionError(
        f"backfill of {job!r}: it needs one date parameter (or one named 'day') to partition by; it has "
        f"{', '.join(dates) or 'none'}"
    )


def _day(value: Any, what: str) -> dt.date:
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError:
        raise WorkflowError(f"{what} must be a date as YYYY-MM-DD, got {value!r}") from None


def backfill(
    job: str,
    start: Any,
    end: Any,
    *,
    params: Mapping[str, Any] | None = None,
    concurrency: int = 1,
    force: bool = False,
    started_by: str = "",
    as_children: bool = False,
) -> Workflow:
    """Run `job` (a Spark job, a task, or a workflow with a date parameter) once per day from `start` to `end`
    (both included), at most `concurrency` days at a time: day i waits for day i-K (K lanes). A failed day does
    not stop the others (a task or Spark job's step continues); repair re-runs just the failed days.

    `as_children` (a workflow only): each day is a child workflow of this one, a sub-workflow step named by the
    day (workflows/children.py) rather than the day's steps copied in; a repair re-runs the failed children."""
    first, last = _day(start, "--from"), _day(end, "--to")
    if first > last:
        raise WorkflowError(f"backfill range is empty: from {first} is after to {last}")
    days = (last - first).days + 1
    if days > MAX_BACKFILL_PARTITIONS and not force:
        raise WorkflowError(
            f"backfill of {days} partitions is more than {MAX_BACKFILL_PARTITIONS}; pass --force (force=True) to run it"
        )
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise WorkflowError(f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}, not {concurrency!r}")
    params = dict(params or {})
    kind, date_param = _partition_param(job)
    if as_children and kind != "workflow":
        raise WorkflowError(f"backfill of {job!r} as children: only a workflow runs as child workflows, not a {kind}")
    if date_param in params:
        raise WorkflowError(f"backfill of {job!r}: {date_param!r} is the partition; do not pass it as a parameter")
    graph = Graph(f"backfill {job}")
    firsts: list[list[str]] = []  # per day: the names of its steps with nothing to wait for, and its last steps
    lasts: list[list[str]] = []
    for i in range(days):
        day = (first + dt.timedelta(days=i)).isoformat()
        values = {**params, date_param: day}
        if kind == "spark":
            graph.spark(job, values, name=day, group=day, on_failure=OnFailure.CONTINUE)
            firsts.append([day])
            lasts.append([day])
        elif kind == "task":
            graph.task(job, values, name=day, group=day, on_failure=OnFailure.CONTINUE)
            firsts.append([day])
            lasts.append([day])
        elif as_children:
            graph.workflow(job, values, name=day, group=day, on_failure=OnFailure.CONTINUE)
            firsts.append([day])
            lasts.append([day])
        else:
            definition = get_workflow(job)
            sub, order = definition.graph(definition.validate(values))
            for name in order:
                step = sub.steps[name]
                step.name, step.group = f"{day} {name}", day
                step.after = [f"{day} {a}" for a in step.after]
                graph._add(step)
            needed = {a for s in sub.steps.values() for a in s.after}
            firsts.append([s.name for s in sub.steps.values() if not s.after])
            lasts.append([s.name for s in sub.steps.values() if s.name not in needed])
    order = graph.order()
    lanes = [(up, down) for i in range(concurrency, days) for up in lasts[i - concurrency] for down in firsts[i]]
    summary = {
        "job": job,
        "from": first.isoformat(),
        "to": last.isoformat(),
        "concurrency": concurrency,
        "params": params,
    }
    if as_children:
        summary["as_children"] = True
    return _create(f"backfill {job}", WorkflowKind.BACKFILL, summary, graph, order, started_by, order_edges=lanes)


# -- reading --------------------------------------------------------------------------------------------------


# What status shows for a waiting step whose item is not running: a sleep's, an event wait's (its timeout).
WAITING_STATES = {
    (StepKind.SLEEP, StepState.QUEUED): "sleeping",
    (StepKind.EVENT, StepState.QUEUED): "waiting_event",
    (StepKind.APPROVAL, StepState.QUEUED): "waiting_approval",
    (StepKind.WORKFLOW, StepState.QUEUED): "waiting_child",
}


def status(workflow_id: int) -> dict[str, Any]:
    """id, name, state, attempt, error and every step of the current attempt (name, state, kind, item, run,
    result, error). A queued
    step is "running" while its item is leased; a sleep step is "sleeping" before, an event wait
    "waiting_event", an approval "waiting_approval"; a Spark step parked because a dataset partition it reads
    failed its blocking checks (or they still run) is "blocked", with `blocked_by` saying why; a sub-workflow
    step is "waiting_child" while its child runs, with `child_workflow_id`. `parent` names the step that started
    this workflow ({"workflow_id", "name", "step", "attempt"}, else None), `children` the children of this
    attempt's sub-workflow steps ({"step", "workflow_id", "name", "state"})."""
    workflow = Workflow.objects.filter(id=workflow_id).first()
    if workflow is None:
        raise WorkflowError(f"no workflow {workflow_id}")
    running = set(
        WorkflowStep.objects.filter(workflow_id=workflow.id, attempt=workflow.attempt, state=StepState.QUEUED)
        .filter(item_id__in=_reserved_items(workflow))
        .values_list("id", flat=True)
    )
    rows = list(WorkflowStep.objects.filter(workflow_id=workflow.id, attempt=workflow.attempt).order_by("id"))
    parked = why_held(s.item_id for s in rows if s.kind == StepKind.SPARK and s.state == StepState.QUEUED)
    steps = []
    for s in rows:
        step = {
            "name": s.name,
            "state": "running" if s.id in running else WAITING_STATES.get((s.kind, s.state), s.state),
            "kind": s.kind,
            "item_id": s.item_id,
            "spark_run_id": s.spark_run_id,
            "result": s.result,
            "error": s.error or None,
        }
        if s.kind == StepKind.WORKFLOW:  # a sub-workflow step's child (issue 48), once started
            step["child_workflow_id"] = s.child_workflow_id
        if s.item_id in parked and s.id not in running:
            step.update(state="blocked", blocked_by=parked[s.item_id])
        steps.append(step)
    return {
        "id": workflow.id,
        "name": workflow.name,
        "state": workflow.state,
        "attempt": workflow.attempt,
        "error": workflow.error or None,
        "steps": steps,
        # versions, forks, deadlines (issue 39)
        "version": workflow.version,
        "forked_from": workflow.forked_from,
        "fork_step": workflow.fork_step or None,
        "deadline_at": workflow.deadline_at.isoformat() if workflow.deadline_at else None,
        # sub-workflows (issue 48): the step that started this one, and the children of this attempt's steps
        "parent": children.parent_of(workflow.id),
        "children": children.children_of(workflow),
    }


def _reserved_items(workflow: Workflow) -> Any:
    from ..models import QueueItem

    items = WorkflowStep.objects.filter(
        workflow_id=workflow.id, attempt=workflow.attempt, state=StepState.QUEUED
    ).values("item_id")
    return QueueItem.objects.filter(id__in=items, state="reserved").values("id")


def wait(workflow_id: int, *, timeout: float | None = None, poll: float = 0.2) -> Workflow:
    """Block until the workflow has ended (or `timeout` seconds passed); returns its row."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        workflow = Workflow.objects.get(id=workflow_id)
        if workflow.state in WORKFLOW_FINAL_STATES or (deadline is not None and time.monotonic() > deadline):
            return workflow
        time.sleep(poll)
