"""Spark runs as queue work: the services that trigger, cancel and re-run them, and the `queue_app.spark_run`
task that carries each run through the worker.

Every trigger (dashboard, schedule, ORM, `manage.py spark_run`) goes through `trigger_run()`: the parameters are
validated first, then one transaction creates the SparkRun and enqueues its item on the `spark` queue, so a run
never exists without its item or the other way round. The worker runs the item's handler, which launches the run
as its own spark-submit child (launcher.launch) and writes state, progress and log lines back to the row.

Timeouts and leases: the task's hard timeout is fixed when it is registered, so it is the longest a run may
take (MAX_RUN_TIMEOUT) plus the time to stop a run at its timeout (SIGTERM, STOP_GRACE, SIGKILL) and write its
end. A run's own timeout (default and ceiling: MAX_RUN_TIMEOUT) is enforced by the launcher, which always acts
before the supervisor's hard timeout would. The lease is the registry's floor (hard timeout + margin) and the
supervisor renews it by heartbeat while the handler lives; when the worker dies, the run comes back once the
lease has expired. Both bounds are read from the environment (JOBSITE_SPARK_MAX_TIMEOUT, default 3600 s, and
JOBSITE_SPARK_STOP_GRACE, default 10 s) when this module is imported, in the worker as in the triggering process.

Outputs and re-delivery: a job's `publish(outputs, run_id)` runs in the transaction that marks the run
succeeded, fenced on the item's current reservation (an attempt whose reservation was taken away publishes
nothing). Before a new attempt launches, a spark-submit process group left by an earlier attempt on this host
(its worker was killed -9) is killed, so two attempts never write at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.utils import timezone

from .. import engine, services
from ..conf import env_number, queue_settings
from ..engine import tracing
from ..engine.alias import atomic
from ..logcontext import log_context
from ..registry import Context, Retry, Settled, job
from . import eventlog, hooks, spans
from .java import JavaNotFound, check_java
from .launcher import LaunchResult, launch
from .models import SPARK_FINAL_STATES, SparkRun, SparkRunState, SparkTrigger
from .policy import SparkPolicy, policy_for
from .registry import SparkParamError, UnknownSparkJob, all_jobs, get_job
from .session import job_group
from .warm_pool import prepare_warm_runs
from .watch import group_members

logger = logging.getLogger("jobsite.spark")

TASK = "queue_app.spark_run"
QUEUE = "spark"
MAX_RUN_TIMEOUT = env_number("JOBSITE_SPARK_MAX_TIMEOUT", 3600.0, zero_allowed=False, unit=" of seconds")
STOP_GRACE = env_number("JOBSITE_SPARK_STOP_GRACE", 10.0, unit=" of seconds")
# After its timeout a run gets SIGTERM, SIGKILL after the grace, the launcher waits up to the grace twice more for
# the group and 5 s for its pipes; then the handler writes the run's end.
HARD_TIMEOUT = MAX_RUN_TIMEOUT + 3 * STOP_GRACE + 6.0
WRITE_EVERY = 1.0  # seconds between writes of progress and log lines to the run's row
CANCEL_POLL = 0.5  # seconds between reads of the row's state while the child runs
LOG_TAIL_LINES = 200
LOG_TAIL_CHARS = 20_000


# The three ends of a failed run, by the names its item's error carries ("RunFailed: ..."): _settle_item writes
# them with the run's end; raised, as before, by nothing else of the handler.
class RunNotRetried(Exception):
    """The run ended failed for good: its job's policy does not retry this end, or nothing could start."""


class RunNotStartable(RunNotRetried):
    """The run cannot start at all (unknown job, bad parameters, no Java): retrying would not help."""


class RunFailed(Exception):
    """The run's child failed; the queue retries the item per its policy, after `retry_in` seconds (the job's
    own backoff; None: the spark task's, from the settings)."""

    def __init__(self, error: str, retry_in: float | None = None) -> None:
        super().__init__(error)
        self.retry_in = retry_in


# -- services -------------------------------------------------------------------------------------------------


def check_timeout(job_name: str, timeout: Any) -> float | None:
    if timeout is None or timeout == "":
        return None
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        raise SparkParamError(job_name, {"timeout": f"must be a number of seconds, got {timeout!r}"}) from None
    if not 0 < seconds <= MAX_RUN_TIMEOUT:
        raise SparkParamError(job_name, {"timeout": f"must be > 0 and <= {MAX_RUN_TIMEOUT:g} seconds"})
    return seconds


def trigger_run(
    job: str,
    params: Mapping[str, Any] | None,
    *,
    trigger: str,
    requested_by: str = "",
    timeout: float | None = None,
) -> SparkRun:
    """Validate `params` for the job, then create its SparkRun and enqueue the run's item in one transaction.

    Raises UnknownSparkJob or SparkParamError (every bad field at once; what a layer's trigger check refuses,
    spark/hooks.py: a partition that does not fit a dataset the job produces; RunBlocked: a partition it
    consumes failed its blocking checks, or they still run) before anything is written.
    """
    spark_job = get_job(job)
    values = spark_job.validate(params or {})
    if spark_job.prepare is not None:
        values = spark_job.validate(spark_job.dump_params(spark_job.prepare(values)))
    policy = policy_for(spark_job)
    seconds = check_timeout(job, timeout if timeout not in (None, "") else policy.timeout)
    trigger = SparkTrigger(trigger).value
    with atomic():  # the layers' checks in the run's transaction: what they read with a lock stays held until then
        hooks.check_trigger(spark_job, spark_job.dump_params(values))
        run = SparkRun.objects.create(
            job=spark_job.name,
            params=spark_job.dump_params(values),
            trigger=trigger,
            requested_by=(requested_by or "")[:150],
            timeout=seconds,
        )
        options: dict[str, Any] = {"priority": policy.priority, "ordering_key": policy.ordering_key(run.job, run.id)}
        if policy.attempts is not None:
            options["max_attempts"] = policy.attempts
        run.item_id = spark_run.enqueue({"run_id": run.id}, **options).id
        run.save(update_fields=["item_id"])
    logger.info("spark run %s queued: job=%s trigger=%s item=%s", run.id, run.job, trigger, run.item_id)
    return run


def cancel_run(run_id: int, *, actor: str) -> bool:
    """Ask a run to stop: its item is cancelled (services.cancel_items), which cancels a run not started yet at
    once (with its queue item) and moves a starting or running one to `cancelling`, whose handler stops the
    child. False when there is nothing to cancel."""
    with atomic():
        run = SparkRun.objects.select_for_update().filter(id=run_id).first()
        if run is None or run.state in SPARK_FINAL_STATES or run.state == SparkRunState.CANCELLING:
            return False
        if run.item_id is not None:
            services.cancel_items([run.item_id], actor=actor)
        else:  # its item was deleted: nothing runs it, so nothing else can end it
            run.state, run.finished_at = SparkRunState.CANCELLED, timezone.now()
            run.cancel_requested_at = run.finished_at
            run.save(update_fields=["state", "cancel_requested_at", "finished_at"])
    logger.info("spark run %s: cancel requested by %s", run_id, actor or "?")
    return True


def rerun(run_id: int, *, actor: str) -> SparkRun:
    """A new run of the same job with the same parameters and timeout (triggered from the dashboard)."""
    run = SparkRun.objects.get(id=run_id)
    return trigger_run(run.job, run.params, trigger=SparkTrigger.DASHBOARD, requested_by=actor, timeout=run.timeout)


_TRIGGERED = {
    SparkTrigger.DASHBOARD: "from the dashboard",
    SparkTrigger.SCHEDULE: "by a schedule",
    SparkTrigger.ORM: "from code (ORM)",
    SparkTrigger.CLI: "from the CLI",
    SparkTrigger.WORKFLOW: "by a workflow",
    SparkTrigger.DATASET: "by a dataset update",
}


def triggered(run: SparkRun) -> str:
    """How the run came to be, as its page says it: "triggered from the CLI by ana", "triggered by schedule
    nightly" (a schedule's requested_by names it)."""
    who = run.requested_by
    if run.trigger == SparkTrigger.SCHEDULE and who.startswith("schedule "):
        return f"triggered by {who}"
    if run.trigger == SparkTrigger.DATASET and who:  # who: the upstream materializations (datasets/spark_triggers.py)
        return f"triggered by the update of {who}"
    how = _TRIGGERED.get(run.trigger, f"by {run.get_trigger_display()}")
    return f"triggered {how}" + (f" by {who}" if who else "")


def waiting_for(run: SparkRun) -> SparkRun | None:
    """The started run of the same job ahead of a queued `run` in its concurrency lane (policy.py), if any: the
    reason it waits."""
    if run.state != SparkRunState.QUEUED:
        return None
    try:
        policy = policy_for(get_job(run.job))
    except (UnknownSparkJob, SparkParamError):
        return None
    if policy.max_concurrent is None:
        return None
    lane = run.id % policy.max_concurrent
    started = SparkRun.objects.filter(
        job=run.job,
        state__in=[SparkRunState.STARTING, SparkRunState.RUNNING, SparkRunState.CANCELLING],
    ).exclude(id=run.id)
    return next((r for r in started.order_by("id") if r.id % policy.max_concurrent == lane), None)


def prune_runs(*, now: Any = None) -> int:
    """Delete the finished runs of each job past its policy's `keep_days`, with their event logs."""
    now = now or timezone.now()
    pruned = 0
    for spark_job in all_jobs():
        keep = policy_for(spark_job).keep_days
        if keep is None:
            continue
        old = SparkRun.objects.filter(
            job=spark_job.name, state__in=SPARK_FINAL_STATES, finished_at__lt=now - timedelta(days=keep)
        )
        ids = list(old.values_list("id", flat=True)[:10_000])
        if ids:
            SparkRun.objects.filter(id__in=ids).delete()
            eventlog.delete(ids)
            pruned += len(ids)
    return pruned


def prune_event_logs(*, now: Any = None) -> int:
    """Delete the event logs of finished runs older than the `SPARK_EVENT_LOG_KEEP_DAYS` setting whose job sets
    no `keep_days` (a job that does keeps its runs' logs as long as the runs), and the directories of runs that
    no longer exist once they are as old. The run rows stay. Returns how many run directories were deleted."""
    days = queue_settings.SPARK_EVENT_LOG_KEEP_DAYS
    if not days:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=float(days))
    on_disk = eventlog.runs_on_disk()
    if not on_disk:
        return 0
    own_retention = {j.name for j in all_jobs() if policy_for(j).keep_days is not None}
    rows = dict(SparkRun.objects.filter(id__in=list(on_disk)).values_list("id", "job"))
    old = SparkRun.objects.filter(id__in=list(rows), state__in=SPARK_FINAL_STATES, finished_at__lt=cutoff)
    expired = [run_id for run_id, job in old.values_list("id", "job") if job not in own_retention]
    expired += [run_id for run_id, mtime in on_disk.items() if run_id not in rows and mtime < cutoff.timestamp()]
    eventlog.delete(expired)
    return len(expired)


# -- orphans --------------------------------------------------------------------------------------------------


def _belongs_to_run(pid: int, run_id: int) -> bool:
    """Whether process `pid` is part of run `run_id` (guards against a recycled process group id)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    run_arg = str(run_id).encode()
    named = any(a == b"--run-id" and b == run_arg for a, b in zip(args, args[1:], strict=False))
    return job_group(run_id).encode() in args or named


def kill_orphan(run: SparkRun, *, wait: float = 10.0) -> bool:
    """SIGKILL the spark-submit group an earlier attempt of `run` left on this host, if it still lives.
    True when one was found (and is gone now)."""
    if not run.driver_pgid or run.driver_host != socket.gethostname():
        return False
    members = group_members(run.driver_pgid)
    if not any(_belongs_to_run(pid, run.id) for pid in members):
        return False
    logger.warning("spark run %s: killing the orphaned process group %s of an earlier attempt", run.id, members)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.driver_pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while group_members(run.driver_pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


# -- the handler ----------------------------------------------------------------------------------------------


class RunReporter:
    """The launcher's callbacks for one attempt: they write to the run's row, at most about once a second for
    progress and log lines, and read its state for cancel requests."""

    def __init__(self, run_id: int, attempt: int) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.rows = SparkRun.objects.filter(id=run_id, attempt=attempt)  # fenced on this attempt
        self.log: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.progress: dict[str, Any] | None = None
        self.dirty: set[str] = set()
        self.written_at = 0.0
        self.polled_at = 0.0
        self.cancel = False

    def on_start(self, event: dict[str, Any]) -> None:
        pgid = None
        with contextlib.suppress(OSError, TypeError):
            pgid = os.getpgid(int(event["pid"]))  # the Python driver shares the run's process group
        self.rows.filter(state=SparkRunState.STARTING).update(state=SparkRunState.RUNNING)
        self.rows.update(
            app_id=(event.get("app_id") or "")[:100],
            ui_url=(event.get("ui_url") or "")[:200],
            driver_host=socket.gethostname()[:255],
            driver_pgid=pgid,
        )

    def on_progress(self, event: dict[str, Any]) -> None:
        self.progress = event
        self.dirty.add("progress")
        self.flush()

    def on_log(self, line: str) -> None:
        self.log.append(line)
        self.dirty.add("log_tail")
        self.flush()

    def log_tail(self) -> str:
        text = "\n".join(self.log)
        return text[-LOG_TAIL_CHARS:]

    def flush(self, *, force: bool = False) -> None:
        if not self.dirty or (not force and time.monotonic() - self.written_at < WRITE_EVERY):
            return
        fields: dict[str, Any] = {}
        if "progress" in self.dirty:
            fields["progress"] = self.progress
        if "log_tail" in self.dirty:
            fields["log_tail"] = self.log_tail()
        self.rows.update(**fields)
        self.dirty.clear()
        self.written_at = time.monotonic()

    def should_cancel(self) -> bool:
        self.flush()
        now = time.monotonic()
        if not self.cancel and now - self.polled_at >= CANCEL_POLL:
            self.polled_at = now
            state = self.rows.values_list("state", flat=True).first()
            # Gone, taken by another attempt, or asked to cancel: stop the child either way.
            self.cancel = state is None or state == SparkRunState.CANCELLING
        return self.cancel


def _claim(run_id: int, ctx: Context) -> SparkRun | None:
    """Lock the row and mark this attempt `starting`; None when the run must not start (final or cancelled)."""
    with atomic():
        run = SparkRun.objects.select_for_update().filter(id=run_id).first()
        if run is None:
            logger.warning("spark run %s does not exist (item %s): nothing to do", run_id, ctx.item_id)
            return None
        if run.state in SPARK_FINAL_STATES:
            return None  # finished by an earlier attempt, or cancelled before it started
        if run.state == SparkRunState.CANCELLING:  # cancel asked while an earlier attempt was lost
            run.state, run.finished_at = SparkRunState.CANCELLED, timezone.now()
            run.save(update_fields=["state", "finished_at"])
            hooks.changed(run, SparkRunState.CANCELLED)  # OpenLineage ABORT, after commit
            return None
        kill_orphan(run)
        run.state = SparkRunState.STARTING
        run.attempt = ctx.attempt
        run.started_at = timezone.now()
        run.finished_at = None
        run.app_id = run.ui_url = run.driver_host = run.error = ""
        run.driver_pgid = None
        run.progress = {}
        run.metrics = None
        run.timings = None
        run.save()
        hooks.changed(run, SparkRunState.STARTING)  # OpenLineage START, after commit (datasets/spark_lineage.py)
        return run


def _blocked(run_id: int, ctx: Context) -> dict[str, Any] | None:
    """None when a queued run may start. A layer may hold it (hook start_checks, spark/hooks.py): the datasets
    park a run reading a partition whose latest materialization's blocking checks failed or still run, its item
    handed back to the queue (the attempt not spent) until the partition is usable (datasets/spark_runs.py)."""
    if not hooks.start_checks:
        return None
    run = SparkRun.objects.filter(id=run_id, state=SparkRunState.QUEUED).first()
    if run is None:
        return None
    try:
        spark_job = get_job(run.job)
    except UnknownSparkJob:
        return None  # the claim and the launcher say so
    reasons = hooks.blocked_reason(run, spark_job, ctx)
    if reasons is None:
        return None
    logger.info("spark run %s blocked: %s", run.id, reasons)
    return {"run_id": run.id, "state": "blocked", "reason": reasons}


def retried(result: LaunchResult, policy: SparkPolicy, ctx: Context) -> bool:
    """Whether this attempt's end is retried: its policy retries such an end, attempts remain, and the run got
    as far as starting (a run that could not start would fail the same way again)."""
    return policy.retries(result.outcome) and not ctx.is_last_attempt and result.returncode is not None


def _finish(run: SparkRun, result: LaunchResult, reporter: RunReporter, ctx: Context) -> tuple[str, Settled | None]:
    """Write the attempt's end in one transaction: the run's state, the job's publish and what the layers record of
    a success (hook succeeded, spark/hooks.py: the materializations of the datasets it produces), and the settle
    of its queue item (_settle_item), so no reader sees a final run whose item is still held (nor a workflow step
    behind it: the item's settle moves the step).
    Returns the state and the item's settle (None: this attempt kept nothing, or a cancel settled it)."""
    spark_job = get_job(run.job)
    outputs = []  # read before the transaction (hook success_outputs): the event log and the partitions' files
    if result.outcome == "succeeded":
        try:
            outputs = hooks.outputs_of(spark_job, run.params, run.id, result.app_id)
        except SparkParamError as exc:  # its datasets' declarations changed since it was triggered
            logger.error("spark run %s succeeded but its materializations cannot be recorded: %s", run.id, exc)
    with atomic():
        row = SparkRun.objects.select_for_update().filter(id=run.id, attempt=ctx.attempt).first()
        if row is None or row.state in SPARK_FINAL_STATES:
            return (row.state if row else "gone"), None
        if not engine.lock_reserved(ctx):  # the item was cancelled or re-delivered: this attempt keeps nothing
            logger.warning("spark run %s attempt %s lost its reservation; its end is not recorded", run.id, ctx.attempt)
            return "stale", None
        outcome = result.outcome
        policy = policy_for(spark_job)
        if outcome == "succeeded":
            if spark_job.publish is not None and result.outputs is not None:
                spark_job.publish(result.outputs, run.id)
            hooks.record_success(outputs, run.id, run.job)  # in this transaction (the materializations)
            state = SparkRunState.SUCCEEDED
        elif (
            outcome in ("failed", "timed_out")
            and row.state != SparkRunState.CANCELLING
            and retried(result, policy, ctx)
        ):
            state = SparkRunState.QUEUED  # the queue retries it, after its backoff
        elif outcome == "failed" and row.state != SparkRunState.CANCELLING:
            # Failed for good: the last attempt, a failure its policy does not retry, or nothing could be
            # started (bad parameters, no Java, no JDBC jar), which a retry would not change.
            state = SparkRunState.FAILED
        else:
            state = SparkRunState.CANCELLED if outcome != "timed_out" else SparkRunState.TIMED_OUT
        if state == SparkRunState.CANCELLED:
            services.settle_cancelled_run_item(ctx.item_id, ctx.reservation_id, result.error or "cancelled")
        row.state = state
        row.metrics = dict(result.metrics) if outcome == "succeeded" else row.metrics
        row.progress = dict(result.progress or reporter.progress or row.progress or {})
        row.log_tail = reporter.log_tail() or result.log_tail[-LOG_TAIL_CHARS:]
        row.error = result.error or ""
        row.app_id = row.app_id or (result.app_id or "")[:100]
        now = timezone.now()
        row.finished_at = now if state in SPARK_FINAL_STATES else None
        leased = row.started_at.timestamp() if row.started_at else None
        row.timings = {"leased": leased, **result.timings, "recorded": round(now.timestamp(), 3)}
        row.save(
            update_fields=["state", "metrics", "progress", "log_tail", "error", "app_id", "finished_at", "timings"]
        )
        # After the run's row: the settle moves a workflow's Spark step, reading the run's state and metrics.
        settled = None if state == SparkRunState.CANCELLED else _settle_item(run.id, state, result, policy, ctx)
        hooks.changed(row, state, outputs=outputs, error=row.error)  # OpenLineage COMPLETE, FAIL, ABORT after commit
    return state, settled


def _settle_item(run_id: int, state: str, result: LaunchResult, policy: SparkPolicy, ctx: Context) -> Settled:
    """In _finish's transaction, under the item's row lock (engine.lock_reserved): the attempt's settle, as the
    worker would write it for what the handler used to return or raise. Done for a run that succeeded or timed
    out; a retry after the job's backoff (queued again); a dead letter for a failure for good (not retried by its
    policy, or one that could not start, both "not retryable", or its last attempt)."""
    if state in (SparkRunState.SUCCEEDED, SparkRunState.TIMED_OUT):
        done = {"run_id": run_id, "state": state, "app_id": result.app_id, "seconds": result.duration}
        engine.complete(ctx, done)
        return Settled(done)
    error = result.error or "the Spark run failed"
    if state == SparkRunState.QUEUED:
        retry_in = policy.retry_in(ctx.attempt)
        retry_in = spark_run.retry.retry_in(ctx.attempt) if retry_in is None else retry_in
        fate = engine.fail(ctx, f"RunFailed: {error}", retry_in=retry_in)
        return Settled(None, fate, f"RunFailed: {error}", retry_in)
    if result.returncode is None or not ctx.is_last_attempt:
        kind = RunNotStartable if result.returncode is None else RunNotRetried
        error = f"{kind.__name__}: {error}"
        engine.dead(ctx, f"not retryable: {error}"[:200], error)
        return Settled(None, "dead", error)
    error = f"RunFailed: {error}"
    return Settled(None, engine.fail(ctx, error), error)  # the last attempt: a dead letter (attempts exhausted)


# The steps of a run as its page and `spark_run --json` show them, in order: (key in SparkRun.timings, label).
TIMING_STEPS = (
    ("queued", "queued"),
    ("leased", "leased by a worker"),
    ("launched", "child launched"),
    ("driver_up", "driver up"),
    ("first_task", "first task"),
    ("last_task", "last task"),
    ("ended", "child ended"),
    ("recorded", "recorded"),
)


def timing_split(run: SparkRun) -> list[dict[str, Any]]:
    """Each step of the run's last attempt that happened: its key, label, seconds after the run was queued, and
    seconds since the step before. Empty until an attempt has ended."""
    if not run.timings or run.queued_at is None:
        return []
    at = {"queued": run.queued_at.timestamp(), **run.timings}
    steps, previous = [], None
    for key, label in TIMING_STEPS:
        if at.get(key) is None:
            continue
        after = round(at[key] - at["queued"], 2)
        steps.append(
            {
                "step": key,
                "label": label,
                "after": after,
                "took": None if previous is None else round(after - previous, 2),
            }
        )
        previous = after
    return steps


def warm_up() -> None:
    """The Spark run task's warm-up, once in each worker process serving the spark queue (registry.job): the Java
    check runs now (a `java -version`, a JVM start, cached for the process) rather than in the first run's time,
    and the spare light child of warm runs starts (warm_pool.prepare_warm_runs)."""
    with contextlib.suppress(JavaNotFound):  # said by the run that needs it, and by the system check
        check_java()
    prepare_warm_runs()


def _launch(run: SparkRun, reporter: RunReporter, timeout: float) -> LaunchResult:
    return launch(
        run.job,
        run.params,
        run.id,
        on_start=reporter.on_start,
        on_progress=reporter.on_progress,
        on_log=reporter.on_log,
        should_cancel=reporter.should_cancel,
        timeout=timeout,
        grace=STOP_GRACE,
    )


def _trace_result(span: Any, run_id: int, result: LaunchResult) -> None:
    """The run's span: its outcome, progress figures and final metrics as attributes; its Spark jobs and stages
    as child spans, read from its event log now that it ended."""
    span.set_attribute("jobsite.spark.outcome", str(result.outcome))
    span.set_attribute("jobsite.spark.duration_s", result.duration)
    span.set_attribute("jobsite.spark.path", result.path)
    if result.app_id:
        span.set_attribute("spark.app_id", result.app_id)
    span.set_attributes(tracing.scalars("jobsite.spark.progress", dict(result.progress or {})))
    span.set_attributes(tracing.scalars("jobsite.spark.metrics", dict(result.metrics or {})))
    if result.error:
        span.set_status(tracing.trace.StatusCode.ERROR, result.error[:500])
    log = eventlog.log_for(run_id, result.app_id) if result.app_id else None
    if not log:  # said, so that a trace without them says why (a warm run has no event log of its own)
        logger.info(
            "spark run %s: no job and stage spans: no event log of app %s in %s (path %s)",
            run_id,
            result.app_id,
            eventlog.run_dir(run_id),
            result.path,
        )
        return
    try:
        timeline = eventlog.timeline(log)
        if not timeline:
            logger.info("spark run %s: no job and stage spans: its event log %s shows none ended", run_id, log)
        spans.spark_timeline(span, timeline)
    except (OSError, KeyError, TypeError, ValueError):  # a log cut short: the run's span stands alone
        logger.warning("spark run %s: no job and stage spans from its event log", run_id, exc_info=True)


@job(TASK, queue=QUEUE, hard_timeout=HARD_TIMEOUT, retry=Retry(ignore=(RunNotRetried,)), warm_up=warm_up)
def spark_run(payload: Any, ctx: Context) -> dict[str, Any] | Settled:
    """Run one SparkRun (payload {"run_id": id}) as its own spark-submit child."""
    run_id = int(payload["run_id"])
    with log_context(spark_run_id=run_id):  # the launcher's log lines name the run (queue_app/logcontext.py)
        parked = _blocked(run_id, ctx)  # an input not usable: parked until it is
        if parked is not None:
            return parked
        run = _claim(run_id, ctx)
        if run is None:
            return {"run_id": run_id, "state": "skipped"}
        reporter = RunReporter(run.id, ctx.attempt)
        timeout = min(run.timeout or MAX_RUN_TIMEOUT, MAX_RUN_TIMEOUT)
        if tracing.enabled:  # a span for the run, its jobs and stages under it (spans.py)
            with spans.spark_run(run.id, run.job, ctx.attempt) as span:
                result = _launch(run, reporter, timeout)
                _trace_result(span, run.id, result)
            # The run's, its jobs' and stages' spans leave now: a process-pool child ends with os._exit, which
            # would drop what its batch processor still holds (a --burst worker stops right after the run).
            # Beside a Spark run's seconds, one flush costs nothing.
            tracing.flush()
        else:
            result = _launch(run, reporter, timeout)
        state, settled = _finish(run, result, reporter, ctx)
        logger.info(
            "spark run %s attempt %s ended %s (%s) in %.1fs",
            run.id,
            ctx.attempt,
            state,
            result.outcome,
            result.duration,
        )
    if settled is not None:  # the item settled with the run's end: the worker settles nothing more
        return settled
    return {"run_id": run.id, "state": state, "app_id": result.app_id, "seconds": result.duration}
