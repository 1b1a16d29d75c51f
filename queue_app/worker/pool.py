"""Executors: where handlers run, one job per slot at a time; the supervisor decides what runs and when to stop it.

- ProcessPool (default): one forked child process per slot, fed over a pipe. A child past its hard timeout,
  or whose reservation went stale, is SIGKILLed and replaced; a child that dies on its own (os._exit, a
  segfault, a signal) is replaced and its job reported failed, naming the exit code or signal. A handler raising
  SystemExit or KeyboardInterrupt is reported like any exception (class, traceback), then its child exits.
  Children die with the supervisor (PR_SET_PDEATHSIG), so a kill -9 of the worker leaves no handler running
  behind it.
- ThreadPool (`--pool thread`, for I/O-bound and short handlers): threads taking jobs from one shared queue,
  which may hold the worker's prefetch. A thread cannot be killed: at its hard timeout the attempt is failed as
  timed out and the thread is abandoned (it runs on, its outcome is ignored) and a new thread takes its place;
  the supervisor then replaces its whole process once the rest has settled (worker/replace.py), which ends the
  thread. Until then a transactional handler keeps its transaction and its item's row lock: that item is settled
  by its own transaction if the handler returns, or comes back when its lease expires after the rollback.
"""

import contextlib
import ctypes
import logging
import multiprocessing
import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from django.db import connections
from psycopg.pq import TransactionStatus

from .. import stages
from ..engine import tracing
from ..engine.alias import queue_connection
from .execute import Job, Outcome, failed, run_job

_fork = multiprocessing.get_context("fork")
PR_SET_PDEATHSIG = 1


class Pool(Protocol):
    kind: str
    size: int

    def start(self) -> None: ...
    def idle(self) -> int: ...
    def idle_threads(self) -> int: ...
    def submit(self, job: Job) -> None: ...
    def started_at(self, reservation_id: int) -> float | None: ...
    def take_back(self, keep: frozenset[int] = frozenset()) -> list[int]: ...
    def fds(self) -> list[int]: ...
    def collect(self) -> list[Outcome]: ...
    def stop(self, reservation_id: int) -> None: ...
    def shutdown(self) -> None: ...
    def kill(self) -> None: ...


def make_pool(
    kind: str,
    size: int,
    runner: Callable[[Job], Outcome] = run_job,
    backlog: int = 0,
    warm_ups: Sequence[Callable[[], None]] = (),
) -> Pool:
    """`backlog`: jobs a pool may hold beyond its slots (the thread pool's shared queue; a process gets its next
    job from the supervisor, so the process pool ignores it). `warm_ups`: the served tasks' warm-ups, called
    once in each process that runs handlers before its first job (registry.job)."""
    if kind == "process":
        return ProcessPool(size, runner, warm_ups)
    if kind == "thread":
        return ThreadPool(size, runner, backlog, warm_ups)
    raise ValueError(f"unknown pool {kind!r}: use 'process' or 'thread'")


# -- processes ------------------------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    # Not Linux: no prctl; the pipe's EOF then ends the child when it next asks for work.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _warm_connection() -> None:
    """Open this thread's or child's database connection now rather than in its first handler: connecting costs
    a few milliseconds, which would land on the first item's start latency."""
    try:
        queue_connection().ensure_connection()
    except Exception:  # the server is down, or this process may not use it: the first handler finds out
        logging.getLogger("jobsite.worker").debug("could not open the handler connection ahead", exc_info=True)


def _checked_by_socket() -> None:
    """A thread or child that waited for its job: check its open database connections by a look at their
    sockets, not by the round trip Django's CONN_HEALTH_CHECKS makes at the job's first query (a SELECT 1 ahead
    of the handler's first statement: 0.1-1 ms of the item's start). An idle connection in good health has
    nothing to read; one the server closed (a restart, a terminated backend) or wrote to has, and is left to
    Django's check. A thread whose next job was already waiting (a backlog) leaves its check to Django as before."""
    for wrapper in connections.all(initialized_only=True):
        conn = wrapper.connection
        if conn is None or wrapper.health_check_done or not wrapper.health_check_enabled:
            continue
        try:
            readable = select.select([conn.fileno()], [], [], 0)[0]
            idle = conn.info.transaction_status == TransactionStatus.IDLE
        except (OSError, ValueError, AttributeError):
            continue
        if idle and not readable:
            wrapper.health_check_done = True


def _warm_up(warm_ups: Sequence[Callable[[], None]]) -> None:
    for warm_up in warm_ups:
        try:
            warm_up()
        except Exception:  # a warm-up only saves time: the first job does the work itself
            logging.getLogger("jobsite.worker").warning("warm-up %r failed", warm_up, exc_info=True)


def _child_main(conn: Connection, inherited: list[Connection], parent_pid: int, runner, warm_ups=()) -> None:
    _die_with_parent(parent_pid)
    # The supervisor owns shutdown: a SIGINT from the terminal or a SIGTERM sent to the whole process group
    # must not kill a handler mid-run; the supervisor lets it finish, or kills it after the grace period.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for other in inherited:  # the supervisor's ends of the other children's pipes
        other.close()
    if stages.on:
        stages.forget()  # the worker's own stamps, copied by the fork: the worker writes them
    _warm_connection()
    _warm_up(warm_ups)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            break
        if job is None:
            break
        if stages.on:
            stages.picked(job)
        _checked_by_socket()  # a child always waited for its job (it gets one only when idle)
        outcome = runner(job)
        try:
            conn.send(outcome)
        except (OSError, ValueError):
            break
        if outcome.fatal:  # the handler raised SystemExit or the like: reported, now exit as it asked
            break
        if stages.on:
            stages.flush(stages.FLUSH_AT)
    if tracing.enabled:  # the handlers' own spans (what they enqueued): the child ends with os._exit, no atexit
        tracing.flush()
    if stages.on:
        stages.flush()
    connections.close_all()


@dataclass(eq=False)
class _Child:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    job: Job | None = None
    started: float = 0.0


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ProcessPool:
    kind = "process"

    def __init__(
        self, size: int, runner: Callable[[Job], Outcome] = run_job, warm_ups: Sequence[Callable[[], None]] = ()
    ) -> None:
        self.size = size
        self.runner = runner
        self.warm_ups = tuple(warm_ups)
        self.children: list[_Child] = []

    def _spawn(self) -> _Child:
        # A forked child must not share the supervisor's database sockets: close them first (the supervisor
        # reconnects on its next query, the child opens its own on first use).
        connections.close_all()
        parent_end, child_end = _fork.Pipe()
        inherited = [c.conn for c in self.children] + [parent_end]
        process = _fork.Process(
            target=_child_main,
            args=(child_end, inherited, os.getpid(), self.runner, self.warm_ups),
            name="jobsite-worker-child",
            daemon=True,
        )
        process.start()
        child_end.close()
        return _Child(process, parent_end)

    def start(self) -> None:
        for _ in range(self.size):
            self.children.append(self._spawn())

    def idle(self) -> int:
        return sum(1 for c in self.children if c.job is None)

    idle_threads = idle

    def started_at(self, reservation_id: int) -> float | None:
        return next((c.started for c in self.children if c.job and c.job.reservation_id == reservation_id), None)

    def take_back(self, keep: frozenset[int] = frozenset()) -> list[int]:
        return []  # a job goes to a child only when it is idle: it has started

    def submit(self, job: Job) -> None:
        child = next(c for c in self.children if c.job is None)
        child.job, child.started = job, time.monotonic()
        if stages.on:
            stages.submitted(job)
        try:
            child.conn.send(job)
        except OSError:  # it died while idle: its replacement takes the job
            self._replace(child)
            self.submit(job)

    def fds(self) -> list[int]:
        return [c.conn.fileno() for c in self.children if c.job is not None]

    def _replace(self, child: _Child) -> None:
        if child.process.is_alive():
            child.process.kill()
        child.process.join(5)
        child.conn.close()
        with contextlib.suppress(ValueError):  # closing a Process that never got reaped
            child.process.close()
        index = self.children.index(child)
        self.children[index] = self._spawn()

    def collect(self) -> list[Outcome]:
        outcomes = []
        for child in list(self.children):
            if child.job is None or not child.conn.poll():
                continue
            job = child.job
            try:
                outcome = child.conn.recv()
            except (EOFError, OSError):
                child.process.join(5)
                outcome = failed(
                    job.reservation_id,
                    f"the worker child running the handler (pid {child.process.pid}) "
                    f"{_describe_exit(child.process.exitcode)}",
                )
                self._replace(child)
            else:
                child.job = None
                if outcome.fatal:  # the child exits after reporting it: never hand it another job
                    self._replace(child)
            outcomes.append(outcome)
        return outcomes

    def stop(self, reservation_id: int) -> None:
        for child in self.children:
            if child.job is not None and child.job.reservation_id == reservation_id:
                self._replace(child)
                return

    def shutdown(self) -> None:
        for child in self.children:
            if child.job is None:
                with contextlib.suppress(OSError):
                    child.conn.send(None)
            else:
                child.process.kill()
        for child in self.children:
            child.process.join(5)
            if child.process.is_alive():
                child.process.kill()
                child.process.join(5)
            child.conn.close()
        self.children = []

    def kill(self) -> None:
        """Kill every child now (the supervisor is about to exit without settling)."""
        for child in self.children:
            with contextlib.suppress(OSError):
                child.process.kill()


# -- threads --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Thread:
    thread: threading.Thread | None = None
    job: Job | None = None
    started: float = 0.0
    abandoned: bool = False


class ThreadPool:
    """Handler threads taking jobs from one shared queue: a thread that finishes takes the next job at once,
    without a round through the supervisor (which cost a GIL hand-off or two per item). Up to `backlog` jobs may
    wait in the queue beyond the threads (the worker's prefetch); a job's hard timeout counts from when a
    thread takes it (`started_at`), and jobs not taken yet can be taken back (`take_back`) on shutdown."""

    kind = "thread"

    def __init__(
        self,
        size: int,
        runner: Callable[[Job], Outcome] = run_job,
        backlog: int = 0,
        warm_ups: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.size = size
        self.backlog = backlog
        self.runner = runner
        # Run once for the process, by the first handler thread (the threads share the process's state).
        self._warm_ups = list(warm_ups)
        self._warm_ups_lock = threading.Lock()
        self.threads: list[_Thread] = []
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        # Submitted, not taken by a thread yet: whoever pops a job from here first (a thread starting it, or the
        # supervisor taking it back or stopping it) owns it; dict.pop is atomic.
        self.queued: dict[int, Job] = {}
        self.taken: dict[int, _Thread] = {}  # reservation id -> the thread running it
        self.outstanding: set[int] = set()  # submitted and not reported back, stopped or taken back
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Set by the first outcome since the supervisor last collected: one wake-up byte per batch of outcomes,
        # not one write and one wake-up per item.
        self._signalled = False

    def _serve(self, me: _Thread) -> None:
        _warm_connection()
        with self._warm_ups_lock:
            warm_ups, self._warm_ups = self._warm_ups, []
        _warm_up(warm_ups)
        jobs = self.jobs
        while True:
            try:
                job, waited = jobs.get_nowait(), False
            except queue.Empty:
                job, waited = jobs.get(), True
            if job is None:
                break
            if me.abandoned:  # replaced while it ran its last handler: leave the job to the others
                self.jobs.put(job)
                break
            if self.queued.pop(job.reservation_id, None) is None:
                continue  # stopped or taken back before any thread started it
            if stages.on:
                stages.picked(job)
            if waited:
                _checked_by_socket()
            me.job, me.started = job, time.monotonic()
            self.taken[job.reservation_id] = me
            try:
                outcome = self.runner(job)
            except BaseException as exc:  # a runner other than run_job (which reports these itself): carry on
                outcome = failed(job.reservation_id, f"the handler raised {type(exc).__name__}: {exc}")
            me.job = None
            if me.abandoned:
                break  # its outcome was reported as stopped already; a new thread took its place
            self.taken.pop(job.reservation_id, None)
            self.outbox.put(outcome)
            if not self._signalled:
                self._signalled = True
                with contextlib.suppress(BlockingIOError, OSError):
                    os.write(self._wake_w, b".")
        connections.close_all()  # this thread's own connections

    def _new_thread(self) -> _Thread:
        me = _Thread()
        me.thread = threading.Thread(target=self._serve, args=(me,), name="jobsite-handler", daemon=True)
        me.thread.start()
        return me

    def start(self) -> None:
        self.threads = [self._new_thread() for _ in range(self.size)]

    def idle(self) -> int:
        """Jobs it accepts now: a thread each, plus the backlog."""
        return max(0, self.size + self.backlog - len(self.outstanding))

    def idle_threads(self) -> int:
        """Jobs a thread would start at once (nothing queued ahead of them)."""
        return max(0, self.size - len(self.outstanding))

    def submit(self, job: Job) -> None:
        self.outstanding.add(job.reservation_id)
        self.queued[job.reservation_id] = job
        if stages.on:
            stages.submitted(job)
        self.jobs.put(job)

    def started_at(self, reservation_id: int) -> float | None:
        me = self.taken.get(reservation_id)
        return None if me is None else me.started

    def take_back(self, keep: frozenset[int] = frozenset()) -> list[int]:
        """Remove every job no thread has started yet, except those of reservations in `keep`; returns their
        reservation ids."""
        back = [rid for rid in list(self.queued) if rid not in keep and self.queued.pop(rid, None) is not None]
        self.outstanding.difference_update(back)
        return back

    def fds(self) -> list[int]:
        return [self._wake_r]

    def collect(self) -> list[Outcome]:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        # After reading the pipe, before draining: so `_signalled` true always means a byte not read yet, and an
        # outcome put after the drain either finds that byte pending or writes one.
        self._signalled = False
        outcomes = []
        while True:
            try:
                outcome = self.outbox.get_nowait()
            except queue.Empty:
                return outcomes
            if outcome.reservation_id in self.outstanding:  # else: stopped meanwhile, already accounted for
                self.outstanding.discard(outcome.reservation_id)
                outcomes.append(outcome)

    def stop(self, reservation_id: int) -> None:
        """Never start it, or abandon the thread running it (threads cannot be killed) for a new one."""
        self.outstanding.discard(reservation_id)
        if self.queued.pop(reservation_id, None) is not None:
            return
        me = self.taken.pop(reservation_id, None)
        if me is not None and me in self.threads:
            me.abandoned = True  # it exits once its handler returns
            self.threads[self.threads.index(me)] = self._new_thread()

    def shutdown(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for me in self.threads:
            if me.job is None and me.thread is not None:
                me.thread.join(5)
        self.threads = []
        os.close(self._wake_r)
        os.close(self._wake_w)

    def kill(self) -> None:
        """Threads cannot be killed; they end with the process."""
