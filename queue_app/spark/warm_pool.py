"""Warm runs' light children: which runs go through jobsite's Spark Connect server, and the spare child kept
ready for the next one.

One spare light child per launching thread's process: started after a warm run, it sets Django up, imports the
Connect client, opens its session and starts that session's Python worker on the server, then waits on stdin for
the next warm run's arguments. Taken only with the same server and environment; dies with the thread that
started it (PR_SET_PDEATHSIG) and exits when its stdin closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from queue_app.spark import connect, connect_health
from queue_app.spark.commandline import CHILD_SCRIPT, child_environment
from queue_app.spark.script_report import ENV as REPORT_ENV
from queue_app.spark.watch import start_child

if TYPE_CHECKING:
    from queue_app.spark.scripts import BoundScript

_spare: dict[str, Any] = {}
_spare_lock = threading.Lock()


def say(on_log: Callable[[str], Any] | None, line: str) -> None:
    if on_log:
        on_log(line)


def warm_server(script: BoundScript | None, on_log) -> connect.ConnectUrl | None:
    """The Connect server this run goes through, None for spark-submit: warm runs are on (JOBSITE_SPARK_CONNECT),
    the run is a registered function (a script keeps its own driver) and the server is healthy."""
    url = connect.configured()  # a malformed value raised ConnectConfigError before anything started
    if url is None or script is not None:
        return None
    try:
        healthy = connect.reachable(url) and connect_health.is_healthy(url)
    except Exception as exc:  # no database here (a bare launch): trust the port
        healthy = connect.reachable(url)
        if not healthy:
            say(on_log, f"jobsite: health of {url} unknown ({type(exc).__name__})")
    if not healthy:
        say(on_log, f"jobsite: Spark Connect server {url} is not healthy: the run uses spark-submit")
        return None
    return url


# Variables that differ from run to run (the program's report channel, the trace it continues): not part of what
# makes a spare fit, or no spare would ever fit; the spare gets them with the run's arguments (child.py --env).
PER_RUN = (REPORT_ENV, "TRACEPARENT")


def _spare_key(url: Any, child_env: Mapping[str, str]) -> tuple:
    shared = {k: v for k, v in child_environment(child_env).items() if k not in PER_RUN}
    return (str(url), tuple(sorted(shared.items())))


def prepare_light_child(url: Any, child_env: Mapping[str, str]) -> None:
    """Start the spare for the next warm run on `url` with `child_env` (nothing when a fitting one waits)."""
    key = _spare_key(url, child_env)
    with _spare_lock:
        if _spare.get("proc") is not None and _spare["proc"].poll() is None and _spare["key"] == key:
            return
        drop_spare()
        cmd = [sys.executable, CHILD_SCRIPT, "--standby", "--connect", str(url)]
        _spare.update(proc=start_child(cmd, child_env, stdin=subprocess.PIPE), key=key)


def prepare_warm_runs() -> None:
    """Start the waiting light child ahead of this process's first warm run: the Spark run task's warm-up, called
    once in each worker process that serves the spark queue (registry.job). Nothing when warm runs are off
    (JOBSITE_SPARK_CONNECT unset) or the server is not healthy now; the first run then starts its own child."""
    url = warm_server(None, None)
    if url is not None:
        prepare_light_child(url, {})  # the environment runs.execute launches with: the same spare key


def drop_spare() -> None:
    """Stop the waiting spare, if there is one (the caller holds the lock, or nothing else launches)."""
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


def light_child(url: Any, child_env: Mapping[str, str], run_args: list[str], on_log=None) -> subprocess.Popen:
    """The light child of a warm run: the waiting spare when it fits (it gets the run's arguments on stdin; the
    run's log says so), else a new child."""
    with _spare_lock:
        proc = _spare.get("proc")
        if proc is not None and proc.poll() is None and _spare["key"] == _spare_key(url, child_env):
            _spare.clear()
            try:
                per_run = [f"--env={k}={child_env[k]}" for k in PER_RUN if k in child_env]
                proc.stdin.write(json.dumps([*run_args, *per_run]) + "\n")
                proc.stdin.close()
                say(on_log, f"jobsite: warm run: the waiting light child (pid {proc.pid}) takes it")
                return proc
            except OSError:  # it died just now: a new child
                _spare.update(proc=proc, key=None)
        drop_spare()
    return start_child([sys.executable, CHILD_SCRIPT, *run_args], child_env)
