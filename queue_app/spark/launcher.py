"""Running one Spark run as its own child process, and watching it until it ends.

`launch()` is what the worker calls for a SparkRun: it validates the parameters, checks Java, picks the run's
path and starts its child, then follows it (watch.py) until its process group is gone:

* a registered function runs as `spark-submit child.py ...` (commandline.py) with its own JVM, or, when warm runs
  are on and the server is healthy, as a light Python child through jobsite's Spark Connect server (warm_pool.py;
  a lost server sends the attempt to spark-submit);
* an existing script runs unmodified under spark-submit; its driver's status REST API (statusapi.py) gives its
  progress and its event log (eventlog.py) the final numbers.

The outcome: `succeeded` when the child wrote a succeeded result (the output file is written atomically after
the job returned, so it is the proof of success even if a late signal followed); otherwise `timed_out` or
`cancelled` when the launcher stopped it for that reason (or the child says it was cancelled); else `failed`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from queue_app.engine import tracing
from queue_app.spark import connect, eventlog, protocol, script_report, session, statusapi
from queue_app.spark.commandline import child_args, script_command, submit_command
from queue_app.spark.java import JavaNotFound, check_java
from queue_app.spark.policy import policy_for
from queue_app.spark.registry import SparkJobError, get_job
from queue_app.spark.warm_pool import light_child, prepare_light_child, say, warm_server
from queue_app.spark.watch import Outcome, Watch, exit_message, failure_reason, start_child

DEFAULT_GRACE = 10.0


@dataclass(frozen=True)
class LaunchResult:
    outcome: Outcome
    metrics: Mapping[str, Any] = field(default_factory=dict)
    outputs: Any = None
    app_id: str | None = None
    error: str = ""
    log_tail: str = ""
    returncode: int | None = None
    duration: float = 0.0
    progress: Mapping[str, Any] | None = None  # the last progress event
    path: str = "spark-submit"  # or "connect": through jobsite's Spark Connect server (connect.py)
    fallback: str | None = None  # why a run meant for the Connect server ran with spark-submit
    # When each step of the (last) child happened, epoch seconds: launched, driver_up, first_task, last_task,
    # ended. From a script's event log (the driver's clock) where it has them, else as the launcher saw them.
    timings: Mapping[str, float] = field(default_factory=dict)
    pgid: int | None = None  # the (last) child's process group, gone when launch() returns


def launch(
    job: str,
    params: Mapping[str, Any],
    run_id: int | str,
    *,
    on_progress: Callable[[dict[str, Any]], Any] | None = None,
    on_log: Callable[[str], Any] | None = None,
    on_start: Callable[[dict[str, Any]], Any] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    timeout: float | None = None,
    grace: float = DEFAULT_GRACE,
    poll_interval: float = 0.5,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> LaunchResult:
    """Run `job` with `params` as run `run_id` in a spark-submit child and wait for it to end.

    Bad parameters or a missing Java return a `failed` result at once (nothing is started); the message says
    what is wrong. The child's process group is gone when this returns.
    """
    started = time.monotonic()
    try:
        spark_job = get_job(job)
        values = spark_job.validate(params)
        check_java()
        script = spark_job.script.bind(values, spark_job.params) if spark_job.script is not None else None
        connect.configured()  # a malformed JOBSITE_SPARK_CONNECT is said before anything starts
    except (SparkJobError, JavaNotFound, connect.ConnectConfigError) as exc:
        return LaunchResult(outcome="failed", error=str(exc))
    master = master or session.spark_master()
    run_conf = {**policy_for(spark_job).conf(), **spark_job.conf, **(conf or {}), **eventlog.conf(run_id)}
    child_env = dict(env or {})
    child_env[script_report.ENV] = script_report.prepare(run_id)  # the program's own figures (spark_report.py)
    if tracing.enabled and (parent := tracing.traceparent()) is not None:
        # W3C's environment carrier: a PySpark script that uses OpenTelemetry continues the run's trace.
        child_env.setdefault("TRACEPARENT", parent)
    warm = warm_server(script, on_log)
    follow = _Follow(on_progress, on_log, on_start, should_cancel, timeout, grace, poll_interval, started)
    fallback = None
    if warm is not None:
        # A registered function through jobsite's Spark Connect server: a light child, no JVM of its own.
        tag = f"{session.job_group(run_id)}-{uuid.uuid4().hex[:12]}"

        def start_light(output_file: str) -> subprocess.Popen:
            run_args = child_args(job, spark_job.dump_params(values), run_id, output_file)[1:]
            return light_child(warm, child_env, [*run_args, "--connect", str(warm), "--tag", tag], on_log)

        stopped_for, returncode, watch, output = _attempt(run_id, start_light, follow)
        if not (returncode == protocol.EXIT_CONNECT_LOST and stopped_for is None):
            prepare_light_child(warm, child_env)  # for the next warm run of this process
            return _result(output, stopped_for, returncode, watch, time.monotonic() - started, path="connect")
        said = [line for line in watch.tail if line.startswith("jobsite: Spark Connect")]
        fallback = said[-1].removeprefix("jobsite: ") if said else failure_reason(watch.tail) or "server lost"
        say(on_log, "jobsite: the run falls back to spark-submit (Spark Connect: " + fallback[:300] + ")")
    if script is None:

        def submit(output_file: str) -> subprocess.Popen:
            cmd = submit_command(job, spark_job.dump_params(values), run_id, output_file, master=master, conf=run_conf)
            return start_child(cmd, child_env)

        stopped_for, returncode, watch, output = _attempt(run_id, submit, follow)
        output = _settled_progress(output, run_id, watch)
    else:
        # No jobsite code runs in the script's driver: its event log, read as it grows, tells progress and the
        # final numbers; its UI's status REST API, on a loopback port picked here, counts tasks once a job has run
        # a while (statusapi.py). The conf's tag names this attempt's log and driver.
        port, tag = statusapi.free_port(), f"{run_id}-{uuid.uuid4().hex[:12]}"
        run_conf.update({"spark.ui.enabled": "true", "spark.ui.port": str(port), statusapi.TAG: tag})
        child_env = {**script.spec.env, **child_env}
        if master.startswith("local"):
            child_env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the UI binds loopback only
        cmd = script_command(script, run_id, master=master, conf=run_conf)
        stopped_for, returncode, watch, output = _attempt(
            run_id,
            lambda output_file: start_child(cmd, child_env),
            follow,
            read=lambda returncode, watch: _script_output(returncode, watch, run_id),
            status=(port, tag),
        )
    return _result(
        output, stopped_for, returncode, watch, time.monotonic() - started, path="spark-submit", fallback=fallback
    )


@dataclass(frozen=True)
class _Follow:
    """What following a child needs: the caller's callbacks, cancel and timeout."""

    on_progress: Callable[[dict[str, Any]], Any] | None
    on_log: Callable[[str], Any] | None
    on_start: Callable[[dict[str, Any]], Any] | None
    should_cancel: Callable[[], bool] | None
    timeout: float | None
    grace: float
    poll_interval: float
    started: float


def _attempt(run_id, start, follow: _Follow, *, read=None, status: tuple[int, str] | None = None):
    """One child of the run: `start(output_file)` starts it, then it is followed (a script's event log and status
    API too, with `status` = (port, tag)) until its process group is gone. Its output: the output file it wrote,
    or `read(returncode, watch)`. Returns (stopped_for, returncode, watch, output)."""
    workdir = tempfile.mkdtemp(prefix=f"{session.job_group(run_id)}-")
    output_file = os.path.join(workdir, "result.json")
    try:
        proc = start(output_file)
        launched = time.time()
        watch = Watch(proc, on_progress=follow.on_progress, on_log=follow.on_log, on_start=follow.on_start)
        watch.seen["launched"] = launched
        poller = None
        if status is not None:
            port, tag = status
            log_dir = eventlog.run_dir(run_id)
            poller = statusapi.StatusPoller(port, tag, proc.pid, watch.lines.put, log_dir=log_dir)
            poller.start()
        try:
            stopped_for = watch.run(
                follow.should_cancel, follow.timeout, follow.grace, follow.poll_interval, follow.started
            )
        finally:
            if poller is not None:
                poller.stop()
            watch.stop_group(follow.grace)  # also when a callback raised: never leave a process behind
        output = _read_output(output_file) if read is None else read(proc.returncode, watch)
        return stopped_for, proc.returncode, watch, output
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _script_output(returncode: int | None, watch: Watch, run_id: int | str) -> dict[str, Any]:
    """What a script's run left, shaped like the child's output file: the exit code says whether it succeeded,
    its event log gives the final progress and metrics, its log tail the failure reason."""
    output: dict[str, Any] = {"app_id": watch.app_id}
    log = eventlog.log_for(run_id, watch.app_id) if watch.app_id else None
    if log:
        output["progress"], output["metrics"], output["times"] = eventlog.summarize(log)
    if returncode == 0:
        output["status"] = "succeeded"
    else:
        output["status"] = "failed"
        output["error"] = failure_reason(watch.tail) or exit_message(returncode, watch.tail)
    return output


def _settled_progress(output: dict[str, Any] | None, run_id: int | str, watch: Watch) -> dict[str, Any] | None:
    """The child's final progress with its event log's over it. The child reads Spark's status tracker as soon
    as its job returned, and the tracker is fed by the listener bus on a thread of its own: under load it may not
    have taken the last tasks' ends yet (2 tasks, 1 done: the fresh clone's `1 == 2`). The event log is complete
    once the driver stopped (stopping drains the bus), so its counts have the last word (never lower: monotonic).
    """
    if not output:
        return output
    app_id = output.get("app_id") or watch.app_id
    log = eventlog.log_for(run_id, app_id) if app_id else None
    if log is None:
        return output
    try:
        settled = eventlog.summarize(log)[0]
    except OSError:
        return output
    # The child's other keys (elapsed) stay; nothing is active any more once the driver stopped.
    progress = {**protocol.monotonic(settled, output.get("progress")), "tasks_active": 0, "active_stages": []}
    return {**output, "progress": progress}


def _read_output(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _result(
    output: dict[str, Any] | None,
    stopped_for: Outcome | None,
    returncode: int | None,
    watch: Watch,
    duration: float,
    *,
    path: str = "spark-submit",
    fallback: str | None = None,
) -> LaunchResult:
    output = output or {}
    status = output.get("status")
    if status == "succeeded":
        outcome: Outcome = "succeeded"
    elif stopped_for is not None:
        outcome = stopped_for
    elif status == "cancelled" or returncode == protocol.EXIT_CANCELLED:
        outcome = "cancelled"
    else:
        outcome = "failed"
    error = ""
    if outcome == "timed_out":
        error = "timed out: stopped by the launcher"
    elif outcome == "cancelled":
        error = "cancelled"
    elif outcome == "failed":
        error = output.get("error") or exit_message(returncode, watch.tail)
    return LaunchResult(
        outcome=outcome,
        metrics=output.get("metrics") or {},
        outputs=output.get("outputs"),
        app_id=output.get("app_id") or watch.app_id,
        error=error,
        log_tail="\n".join(watch.tail),
        returncode=returncode,
        duration=round(duration, 3),
        progress=_with_path(protocol.monotonic(watch.progress, output.get("progress")), path, fallback),
        path=path,
        fallback=fallback,
        timings={step: round(at, 3) for step, at in {**watch.seen, **(output.get("times") or {})}.items()},
        pgid=watch.pgid,
    )


def _with_path(progress: dict[str, Any], path: str, fallback: str | None) -> dict[str, Any]:
    """The run's progress says which path it took (and why it fell back, if it did)."""
    progress = {**progress, "path": path}
    if fallback:
        progress["fallback"] = fallback[:500]
    return progress
