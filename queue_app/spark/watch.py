"""A run's child process: started in its own process group, then followed until the group is gone.

`start_child()` starts a command in a new session, so the JVM, the Python driver and their Python workers form
one process group, which dies with the thread that started it (PR_SET_PDEATHSIG). `Watch` then, until the group
is gone:

* reads the child's stdout and stderr line by line: progress/started events go to `on_progress`/`on_start`,
  everything else to `on_log` and the log tail. Callbacks run in the caller's thread (safe for the ORM);
* polls `should_cancel()` about every `poll_interval` seconds and watches the timeout; either one sends
  SIGTERM to the group (the child cancels its job group), then SIGKILL after `grace` seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from queue_app.spark import protocol
from queue_app.spark.commandline import PROJECT_ROOT, child_environment

Outcome = Literal["succeeded", "failed", "cancelled", "timed_out"]
LOG_TAIL_LINES = 200

PR_SET_PDEATHSIG = 1
try:  # looked up here, not after fork: dlopen in a forked child of a threaded process can deadlock
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no prctl; orphans are then killed when the run is re-delivered
    _prctl = None


def child_preexec() -> None:
    """In spark-submit's process, before exec: die with the thread that launched it (a worker killed -9 must
    not leave a JVM writing output behind it), and take SIGTERM/SIGINT back from a parent that ignores them
    (the worker's pool children do), so the launcher's SIGTERM reaches the JVM and the driver."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_child(cmd: list[str], child_env: Mapping[str, str], stdin: int = subprocess.DEVNULL) -> subprocess.Popen:
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
        preexec_fn=child_preexec,
    )


class Watch:
    """Follows one child: its output lines, cancel and timeout, and the end of its process group."""

    def __init__(self, proc: subprocess.Popen, *, on_progress, on_log, on_start) -> None:
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the child leads its own group
        self.on_progress, self.on_log, self.on_start = on_progress, on_log, on_start
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.app_id: str | None = None
        self.progress: dict[str, Any] | None = None
        # When (epoch seconds) the launcher saw each step: the driver up (STARTED), the first task running or
        # done, the last task done (the latest rise of tasks_done), the child's exit.
        self.seen: dict[str, float] = {}
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
                    self.seen["ended"] = time.time()
                # A grandchild that kept a pipe open must not hold us after the child itself is gone.
                if exited_at is not None and now - exited_at > 5:
                    break
        self.proc.wait()
        self.seen.setdefault("ended", time.time())
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
            self.seen.setdefault("driver_up", time.time())
            if self.on_start:
                self.on_start(payload)
        elif kind == protocol.PROGRESS:
            done_before = (self.progress or {}).get("tasks_done") or 0
            self.progress = protocol.monotonic(self.progress, payload)
            if self.progress.get("tasks_active") or self.progress.get("tasks_done"):
                self.seen.setdefault("first_task", time.time())
            if (self.progress.get("tasks_done") or 0) > done_before:
                self.seen["last_task"] = time.time()
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


def exit_message(returncode: int | None, tail: Sequence[str]) -> str:
    last = [line for line in tail if line.strip()][-5:]
    return f"spark-submit exited with code {returncode} without a result" + (": " + " | ".join(last) if last else "")
