"""Running one Spark run as its own `spark-submit` child process, and watching it until it ends.

`launch()` is what the worker calls for a SparkRun: it validates the parameters, checks Java, starts
spark-submit (SPARK_HOME = the installed pyspark, PYSPARK_PYTHON = this interpreter) in a new session so the
JVM, the Python driver and their Python workers form one process group, and then, until the group is gone:

* reads the child's stdout and stderr line by line: progress/started events go to `on_progress`/`on_start`,
  everything else to `on_log` and the log tail. Callbacks run in the caller's thread (safe for the ORM);
* polls `should_cancel()` about every `poll_interval` seconds and watches the timeout; either one sends
  SIGTERM to the group (the child cancels its job group), then SIGKILL after `grace` seconds.

The outcome: `succeeded` when the child wrote a succeeded result (the output file is written atomically after
the job returned, so it is the proof of success even if a late signal followed); otherwise `timed_out` or
`cancelled` when the launcher stopped it for that reason (or the child says it was cancelled); else `failed`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from queue_app.spark import connect, eventlog, protocol, session, statusapi
from queue_app.spark.java import JavaNotFound, check_java
from queue_app.spark.policy import policy_for
from queue_app.spark.registry import SparkJobError, get_job
from queue_app.spark.scripts import BoundScript

Outcome = Literal["succeeded", "failed", "cancelled", "timed_out"]
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GRACE = 10.0
LOG_TAIL_LINES = 200


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


def _submit_head(run_id: int | str, master: str | None, conf: Mapping[str, str] | None) -> list[str]:
    cmd = [
        os.path.join(session.spark_home(), "bin", "spark-submit"),
        "--master",
        master or session.spark_master(),
        "--name",
        session.job_group(run_id),
    ]
    for key, value in session.run_conf(run_id, conf).items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def submit_command(
    job: str,
    params: Mapping[str, Any],
    run_id: int | str,
    output_file: str,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """The spark-submit command line of a run (`params` already validated and JSON-safe)."""
    return _submit_head(run_id, master, conf) + child_args(job, params, run_id, output_file)


def child_args(job: str, params: Mapping[str, Any], run_id: int | str, output_file: str) -> list[str]:
    """child.py and its arguments for one run."""
    return [
        CHILD_SCRIPT,
        "--job",
        job,
        "--params-json",
        json.dumps(dict(params), separators=(",", ":")),
        "--run-id",
        str(run_id),
        "--output-file",
        output_file,
    ]


def script_command(
    script: BoundScript, run_id: int | str, *, master: str | None = None, conf: Mapping[str, str] | None = None
) -> list[str]:
    """The spark-submit command line of an existing script: its own file and arguments, nothing of jobsite's."""
    return _submit_head(run_id, master, conf) + script.submit_options() + [script.path, *script.args]


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of spark-submit: this interpreter for the driver and the Python workers, this project on
    the path, Spark from the installed pyspark."""
    env = dict(os.environ)
    env.pop("PYSPARK_SUBMIT_ARGS", None)  # meant for in-process sessions; spark-submit gets its own arguments
    env.update(
        SPARK_HOME=session.spark_home(),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p),
    )
    env.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
    env.update(extra or {})
    # pyspark marks a process that opened a Connect session (a probe, the bench) in its environment, and copies
    # of that environment carry the marks: a spark-submit child with them would be a Connect client. The
    # launcher says which path a run takes.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE"):
        env.pop(name, None)
    return env


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
    warm = _warm_server(script, master, on_log)
    follow = _Follow(on_progress, on_log, on_start, should_cancel, timeout, grace, poll_interval, started)
    fallback = None
    if warm is not None:
        # A registered function through jobsite's Spark Connect server: a light child, no JVM of its own.
        tag = f"{session.job_group(run_id)}-{uuid.uuid4().hex[:12]}"

        def light_child(output_file: str) -> subprocess.Popen:
            run_args = child_args(job, spark_job.dump_params(values), run_id, output_file)[1:]
            return _light_child(warm, child_env, [*run_args, "--connect", str(warm), "--tag", tag], on_log)

        stopped_for, returncode, watch, output = _attempt(run_id, light_child, follow)
        if not (returncode == protocol.EXIT_CONNECT_LOST and stopped_for is None):
            _prepare_light_child(warm, child_env)  # for the next warm run of this process
            return _result(output, stopped_for, returncode, watch, time.monotonic() - started, path="connect")
        said = [line for line in watch.tail if line.startswith("jobsite: Spark Connect")]
        fallback = said[-1].removeprefix("jobsite: ") if said else failure_reason(watch.tail) or "server lost"
        _say(on_log, "jobsite: the run falls back to spark-submit (Spark Connect: " + fallback[:300] + ")")
    if script is None:

        def submit(output_file: str) -> subprocess.Popen:
            cmd = submit_command(job, spark_job.dump_params(values), run_id, output_file, master=master, conf=run_conf)
            return _start(cmd, child_env)

        stopped_for, returncode, watch, output = _attempt(run_id, submit, follow)
    else:
        # No jobsite code runs in the script's driver: its UI's status REST API, on a loopback port picked
        # here and tagged with this attempt, tells progress; its event log tells the final numbers.
        port, tag = statusapi.free_port(), f"{run_id}-{uuid.uuid4().hex[:12]}"
        run_conf.update({"spark.ui.enabled": "true", "spark.ui.port": str(port), statusapi.TAG: tag})
        child_env = {**script.spec.env, **child_env}
        if master.startswith("local"):
            child_env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the UI binds loopback only
        cmd = script_command(script, run_id, master=master, conf=run_conf)
        stopped_for, returncode, watch, output = _attempt(
            run_id,
            lambda output_file: _start(cmd, child_env),
            follow,
            read=lambda returncode, watch: _script_output(returncode, watch, run_id),
            status=(port, tag),
        )
    return _result(
        output, stopped_for, returncode, watch, time.monotonic() - started, path="spark-submit", fallback=fallback
    )


def _say(on_log: Callable[[str], Any] | None, line: str) -> None:
    if on_log:
        on_log(line)


def _warm_server(script: BoundScript | None, master: str, on_log) -> Any:
    """The Connect server this run goes through, None for spark-submit: warm runs are on (JOBSITE_SPARK_CONNECT),
    the run is a registered function (a script keeps its own driver) and the server is healthy."""
    from queue_app.spark import connect

    url = connect.configured()  # a malformed value raised ConnectConfigError before anything started
    if url is None or script is not None:
        return None
    from queue_app.spark import connect_health

    try:
        healthy = connect.reachable(url) and connect_health.is_healthy(url)
    except Exception as exc:  # no database here (a bare launch): trust the port
        healthy = connect.reachable(url)
        if not healthy:
            _say(on_log, f"jobsite: health of {url} unknown ({type(exc).__name__})")
    if not healthy:
        _say(on_log, f"jobsite: Spark Connect server {url} is not healthy: the run uses spark-submit")
        return None
    return url


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
    """One child of the run: `start(output_file)` starts it, then it is followed (with a status API poller on
    `status` = (port, tag)) until its process group is gone. Its output: the output file it wrote, or
    `read(returncode, watch)`. Returns (stopped_for, returncode, watch, output)."""
    workdir = tempfile.mkdtemp(prefix=f"{session.job_group(run_id)}-")
    output_file = os.path.join(workdir, "result.json")
    try:
        proc = start(output_file)
        watch = _Watch(proc, on_progress=follow.on_progress, on_log=follow.on_log, on_start=follow.on_start)
        poller = None
        if status is not None:
            poller = statusapi.StatusPoller(status[0], status[1], proc.pid, watch.lines.put)
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


def _start(cmd: list[str], child_env: Mapping[str, str], stdin: int = subprocess.DEVNULL) -> subprocess.Popen:
    """Start a child in its own process group (it leads it), dying with the thread that started it."""
    return subprocess.Popen(
        cmd,
        cwd=PROJECT_ROOT,
        env=child_environment(child_env),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
        preexec_fn=_child_preexec,
    )


# One spare light child per launching thread's process: started after a warm run, it sets Django up, imports
# the Connect client, opens its session and starts that session's Python worker on the server, then waits on
# stdin for the next warm run's arguments. Taken only with the same server and environment; dies with the
# thread that started it (PR_SET_PDEATHSIG) and exits when its stdin closes.
_spare: dict[str, Any] = {}
_spare_lock = threading.Lock()


def _spare_key(url: Any, child_env: Mapping[str, str]) -> tuple:
    return (str(url), tuple(sorted(child_environment(child_env).items())))


def _prepare_light_child(url: Any, child_env: Mapping[str, str]) -> None:
    key = _spare_key(url, child_env)
    with _spare_lock:
        if _spare.get("proc") is not None and _spare["proc"].poll() is None and _spare["key"] == key:
            return
        _drop_spare()
        cmd = [sys.executable, CHILD_SCRIPT, "--standby", "--connect", str(url)]
        _spare.update(proc=_start(cmd, child_env, stdin=subprocess.PIPE), key=key)


def prepare_warm_runs() -> None:
    """Start the waiting light child ahead of this process's first warm run: the Spark run task's warm-up, called
    once in each worker process that serves the spark queue (registry.job). Nothing when warm runs are off
    (JOBSITE_SPARK_CONNECT unset) or the server is not healthy now; the first run then starts its own child."""
    url = _warm_server(None, session.spark_master(), None)
    if url is not None:
        _prepare_light_child(url, {})  # the environment runs.execute launches with: the same spare key


def _drop_spare() -> None:
    proc = _spare.pop("proc", None)
    _spare.pop("key", None)
    if proc is None:
        return
    with contextlib.suppress(OSError):
        proc.stdin.close()  # it exits on EOF; a kill makes sure
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        stream.close()


def _light_child(url: Any, child_env: Mapping[str, str], run_args: list[str], on_log=None) -> subprocess.Popen:
    """The light child of a warm run: the waiting spare when it fits (it gets the run's arguments on stdin; the
    run's log says so), else a new child."""
    with _spare_lock:
        proc = _spare.get("proc")
        if proc is not None and proc.poll() is None and _spare["key"] == _spare_key(url, child_env):
            _spare.clear()
            try:
                proc.stdin.write(json.dumps(run_args) + "\n")
                proc.stdin.close()
                _say(on_log, f"jobsite: warm run: the waiting light child (pid {proc.pid}) takes it")
                return proc
            except OSError:  # it died just now: a new child
                _spare.update(proc=proc, key=None)
        _drop_spare()
    return _start([sys.executable, CHILD_SCRIPT, *run_args], child_env)


def _script_output(returncode: int | None, watch: _Watch, run_id: int | str) -> dict[str, Any]:
    """What a script's run left, shaped like the child's output file: the exit code says whether it succeeded,
    its event log gives the final progress and metrics, its log tail the failure reason."""
    output: dict[str, Any] = {"app_id": watch.app_id}
    log = eventlog.log_for(run_id, watch.app_id) if watch.app_id else None
    if log:
        output["progress"], output["metrics"] = eventlog.summarize(log)
    if returncode == 0:
        output["status"] = "succeeded"
    else:
        output["status"] = "failed"
        output["error"] = failure_reason(watch.tail) or _exit_message(returncode, watch.tail)
    return output


_LOG4J = re.compile(r"^\d{2}/\d{2}/\d{2}\b")  # Spark's own log lines: "26/11/25 05:09:09 INFO ..."


def failure_reason(lines: Sequence[str]) -> str:
    """The exception a driver died of, from its output: the last Python traceback's exception line(s) (a
    PySpark error carries its Spark error class, `[TABLE_OR_VIEW_NOT_FOUND] ...`), else the last JVM
    `Exception in thread` line. Empty when there is none."""
    lines = list(lines)
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Traceback (most recent call last):"):
            for i in range(start + 1, len(lines)):
                if lines[i] and not lines[i][0].isspace():
                    reason = [lines[i]]
                    for more in lines[i + 1 : i + 4]:  # a multi-line message, up to the JVM's stack trace
                        if not more.strip() or more.startswith(("JVM stacktrace", "\t", "  ")) or _LOG4J.match(more):
                            break
                        reason.append(more)
                    return "\n".join(reason)[:4000]
            break
    for line in reversed(lines):
        if line.startswith("Exception in thread"):
            return line[:4000]
    return ""


PR_SET_PDEATHSIG = 1
try:  # looked up here, not after fork: dlopen in a forked child of a threaded process can deadlock
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no prctl; orphans are then killed when the run is re-delivered
    _prctl = None


def _child_preexec() -> None:
    """In spark-submit's process, before exec: die with the thread that launched it (a worker killed -9 must
    not leave a JVM writing output behind it), and take SIGTERM/SIGINT back from a parent that ignores them
    (the worker's pool children do), so the launcher's SIGTERM reaches the JVM and the driver."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _Watch:
    """Follows one child: its output lines, cancel and timeout, and the end of its process group."""

    def __init__(self, proc: subprocess.Popen, *, on_progress, on_log, on_start) -> None:
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the child leads its own group
        self.on_progress, self.on_log, self.on_start = on_progress, on_log, on_start
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.app_id: str | None = None
        self.progress: dict[str, Any] | None = None
        self.readers = [
            threading.Thread(target=self._pump, args=(stream,), daemon=True) for stream in (proc.stdout, proc.stderr)
        ]
        for reader in self.readers:
            reader.start()
        self.kill_at: float | None = None

    def _pump(self, stream) -> None:
        try:
            for line in stream:
                self.lines.put(line.rstrip("\n"))
        except (OSError, ValueError):  # closed under us by stop_group()
            pass
        finally:
            self.lines.put(None)

    def run(self, should_cancel, timeout, grace, poll_interval, started) -> Outcome | None:
        """Until the child exits and its output is drained; returns why the launcher stopped it, if it did."""
        stopped_for: Outcome | None = None
        open_streams = len(self.readers)
        next_poll = time.monotonic()
        exited_at: float | None = None
        while open_streams or self.proc.poll() is None:
            try:
                line = self.lines.get(timeout=poll_interval / 2)
            except queue.Empty:
                line = ""
            if line is None:
                open_streams -= 1
            elif line:
                self._handle(line)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + poll_interval
                if stopped_for is None and self.proc.poll() is None:
                    if timeout is not None and now - started > timeout:
                        stopped_for = "timed_out"
                    elif should_cancel is not None and should_cancel():
                        stopped_for = "cancelled"
                    if stopped_for:
                        self.signal(signal.SIGTERM)
                        self.kill_at = now + grace
                if self.kill_at is not None and now >= self.kill_at and self.group_alive():
                    self.signal(signal.SIGKILL)
                    self.kill_at = None
                if exited_at is None and self.proc.poll() is not None:
                    exited_at = now
                # A grandchild that kept a pipe open must not hold us after the child itself is gone.
                if exited_at is not None and now - exited_at > 5:
                    break
        self.proc.wait()
        return stopped_for

    def _handle(self, line: str) -> None:
        event = protocol.decode(line)
        if event is None:
            self.tail.append(line)
            if self.on_log:
                self.on_log(line)
            return
        kind, payload = event
        if kind == protocol.STARTED:
            self.app_id = payload.get("app_id")
            if self.on_start:
                self.on_start(payload)
        elif kind == protocol.PROGRESS:
            self.progress = protocol.monotonic(self.progress, payload)
            if self.on_progress:
                self.on_progress(self.progress)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def group_alive(self) -> bool:
        return bool(group_members(self.pgid))

    def stop_group(self, grace: float) -> None:
        """Make sure nothing of the run is left: SIGTERM what remains, SIGKILL after `grace`."""
        if self.proc.poll() is None or self.group_alive():
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.group_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.group_alive():
                self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`.

    Reads /proc on Linux: `killpg(pgid, 0)` also succeeds for zombies, and an orphaned zombie under an init
    that does not reap would make a finished group look alive forever.
    """
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


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
    watch: _Watch,
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
        error = output.get("error") or _exit_message(returncode, watch.tail)
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
    )


def _with_path(progress: dict[str, Any], path: str, fallback: str | None) -> dict[str, Any]:
    """The run's progress says which path it took (and why it fell back, if it did)."""
    progress = {**progress, "path": path}
    if fallback:
        progress["fallback"] = fallback[:500]
    return progress


def _exit_message(returncode: int | None, tail: Sequence[str]) -> str:
    last = [line for line in tail if line.strip()][-5:]
    return f"spark-submit exited with code {returncode} without a result" + (": " + " | ".join(last) if last else "")
