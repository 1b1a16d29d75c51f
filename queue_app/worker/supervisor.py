"""The supervisor: run_worker's loop. It leases items in batches up to its free slots, starts them in the pool,
settles what finishes (in batches), stops handlers past their hard timeout, renews the leases of items in
flight and its Worker row's heartbeat, runs the maintenance units, and waits for work on LISTEN/NOTIFY with
polling as the fallback.

Delivery modes, from here:
- at-least-once: run, then settle (complete_many; fail with the task's Retry policy; dead letter).
- at-most-once: record durably that the handler starts (engine.start_at_most_once; stale: do not run), run,
  then settle done, or dead on a failure, never retried; should the worker die mid-run, the lease lapses and
  the rescue makes the item a dead letter that says so.
- transactional: the pool runs handler and settle in one transaction (worker/execute.py); failures are
  settled here, after the rollback.

Layout: the options and records in options.py, what becomes of each outcome (complete, retry, dead letter,
hard timeouts) in settling.py (a mixin), the loop, leases, starts, heartbeats and outages here.

Outages: every database round is guarded; on a lost connection the supervisor logs once, backs off (0.5 s
doubling to 10 s) and retries, keeping finished outcomes in memory; they are settled when the server is back
(settles are fenced, so a lease lost meanwhile is reported stale and changes nothing).

A thread-pool handler stuck past its hard timeout: its attempt is settled as timed out, the worker stops
leasing, lets the rest settle, and run() returns REPLACE for run_worker to exec itself again (worker/replace.py).
"""

import contextlib
import gc
import heapq
import logging
import os
import secrets
import select
import signal
import socket
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .. import engine
from ..conf import queue_settings
from ..engine import ALL_QUEUES, Lease, LeaseTerms
from ..logcontext import bind_process
from ..registry import Delivery, Task, find_task, registered_tasks, warm_ups_for
from .execute import Job
from .leasing import LeaseCall
from .listener import FOLLOW, Listener
from .maintenance import Maintenance
from .options import DATABASE_DOWN, DEADLINE_RECHECK, Pending, Running, WorkerOptions
from .pool import Pool, make_pool
from .replace import REPLACE, STOP_SIGNALS, replaced
from .settling import Settling
from .status import Stats, StatusReporter, fields

logger = logging.getLogger("jobsite.worker")

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 10.0
HEARTBEAT_MAX = 10.0  # seconds between heartbeats at most; less when the shortest lease asks for it
# While other items still run, a freed slot and its finished item wait up to this long for company, so settles
# and leases go in batches rather than one round trip per item.
GATHER = 0.005
# Connections a worker opens beyond its own and one per pool slot: its LISTEN connection, its lease thread's
# (worker/leasing.py), and its maintenance thread's (archive, prunes, VACUUM or ANALYZE: worker/maintenance.py)
# while one runs.
OTHER_CONNECTIONS = 3
PACE_EVERY = 0.25  # seconds between updates of the pace a worker's pool keeps (items finished per second)
# A worker whose leases have found all they asked for during this long is working through a backlog: every worker
# has plenty, so it holds its whole prefetch (leases of the largest batches). Counted from the last lease that found
# fewer items ready than it asked for, not from a slot with nothing to start: draining a backlog of short jobs,
# slots empty between two lease round trips all the time, and the worker held back to a fraction of its batch
# (82 items a lease of 250 asked for: 8,600-10,800 no-ops/s on 4 x 16 threads, 12,200-15,500 at whole batches).
BACKLOG_AFTER = 1.0
# A loop iteration that began this much later than the previous one ended (beyond its longest wait) means the
# worker was away: frozen (SIGSTOP, a paused VM), or stuck in a blocking call. Its leases may have lapsed.
AWAY_AFTER = 2.0


class Supervisor(Settling):
    def __init__(self, options: WorkerOptions, pool: Pool | None = None) -> None:
        self.options = opts = options
        self.pool = pool
        self.stats = Stats()
        self.worker_id = opts.worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        bind_process(worker_id=self.worker_id)  # every log line of the process names its worker (logcontext.py)
        self.queues = None if opts.queues is None or tuple(opts.queues) == ALL_QUEUES else list(opts.queues)
        # Running plus leased-not-started items: a short handler finds its next item in hand, not a round trip
        # away. Held items' leases are renewed like running ones, so waiting in hand never lets a lease lapse.
        self.capacity = opts.concurrency + (opts.concurrency if opts.prefetch is None else opts.prefetch)
        self.batch = opts.batch or self.capacity
        self.terms: engine.Terms = {}
        self.row = engine.WorkerRow(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=list(ALL_QUEUES) if self.queues is None else self.queues,
            concurrency=opts.concurrency,
            started_at=datetime.now(UTC),
        )
        self.listener = Listener(self.queues)
        self.maintenance = Maintenance(scheduler=opts.scheduler)
        self.status = StatusReporter()
        self.running: dict[int, Running] = {}
        self.next_deadline = float("inf")  # no running item's hard timeout is earlier (may be early: then rechecked)
        self.leased: list[tuple[Lease, Task]] = []  # leased, not started yet
        # The settle-and-lease statement runs on a thread of its own while the loop goes on (worker/leasing.py).
        self.lease_call = LeaseCall(self._wake)
        self.done: list[tuple[Lease, Any]] = []  # handler returned: complete_many these
        self.pending: list[Pending] = []
        handed = replaced()  # from the process this one replaced (worker/replace.py), if any
        self.replaces = handed.get("worker_id")
        self.taken = int(handed.get("taken", 0))  # --max-items counts on across a replacement
        self.stopping = False
        self.replacing = False  # a handler thread is stuck: stop, let the rest settle, then replace the process
        self.release_held = False  # on a signal: hand back held items that have not started (not on --max-items)
        self.grace_deadline = float("inf")
        self.registered = False
        self.woken = True
        self.maybe_more = True
        self.next_poll = 0.0
        self.next_heartbeat = 0.0
        self.gather_since: float | None = None  # when the first slot freed since the last lease
        self.db_down_since: float | None = None
        self.db_backoff = BACKOFF_FIRST
        self.db_retry_at = 0.0
        self.listener_retry_at = 0.0
        self.wake_at = float("inf")  # a follower's lease after a notification (see worker/listener.py)
        self.next_first_try = 0.0  # a follower's next try for the wake lock
        self.idle_after_lease = False
        self.heartbeat_every = self._heartbeat_cap()
        self.due: list[float] = []  # heap: when items this worker sent back for a retry become due
        self.away = False  # the loop was away (frozen, cut off): check leases and settle before anything else
        self.waited_from, self.waited_for = time.monotonic(), 0.0  # the last wait: since when, for how long
        self.pace = 0.0  # items finished per second lately (0: none measured yet)
        self.pace_count, self.pace_since = 0, time.monotonic()
        self.ran_dry_at = time.monotonic()  # when a lease last found fewer items ready than it asked for

    # -- start and stop -------------------------------------------------------------------------------------

    @staticmethod
    def _heartbeat_cap() -> float:
        # Other workers rescue the leases of a worker silent for WORKER_LOST_AFTER: beat well inside it.
        return min(HEARTBEAT_MAX, queue_settings.WORKER_LOST_AFTER / 3)

    def check(self) -> None:
        """Refuse to start with bad options or a task whose lease could expire under a live handler."""
        tasks = registered_tasks()  # imports every app's tasks.py, before the pool forks
        problems = self.options.problems() + [p for task in tasks.values() for p in task.problems()]
        if problems:
            raise ImproperlyConfigured("the worker cannot start:\n  " + "\n  ".join(problems))
        shortest = min(((t.lease_timeout or t.min_lease) for t in tasks.values()), default=HEARTBEAT_MAX * 3)
        # Each lease takes its task's lease in the lease statement itself (no second round trip to set it).
        self.terms = {name: (t.lease_timeout, t.min_lease) for name, t in tasks.items()}
        self.heartbeat_every = min(self._heartbeat_cap(), shortest / 3)

    def check_connection_room(self) -> None:
        """Shrink to fit when the server has fewer connections left than this worker would open (every pool
        thread or child opens its own as it starts; those refused, "too many clients", would leave the worker
        retrying): run with as many slots as there is room for, at least one, and say so once."""
        need = self.options.concurrency + OTHER_CONNECTIONS
        try:
            room = engine.connection_room()
        except DATABASE_DOWN:
            return  # the loop says so, and retries
        if room < need:
            fits = max(1, room - OTHER_CONNECTIONS)
            logger.warning(
                "too few database connections left for this worker %s; running with --concurrency %d instead; "
                "raise the limit (max_connections, or the role's or the database's CONNECTION LIMIT) or lower "
                "--concurrency",
                fields(needs=need, server_has_room_for=room),
                fits,
            )
            self._resize(fits)

    def _resize(self, concurrency: int) -> None:
        """Run with `concurrency` slots (before the pool starts); a default prefetch and batch follow it."""
        self.options = opts = replace(self.options, concurrency=concurrency)
        self.capacity = opts.concurrency + (opts.concurrency if opts.prefetch is None else opts.prefetch)
        self.batch = opts.batch or self.capacity
        self.row = replace(self.row, concurrency=concurrency)

    def run(self) -> int:
        self.check()
        self.check_connection_room()
        # Everything loaded so far (Django, the apps, every task module: ~86,000 objects) lives as long as the
        # process: out of the collector's sight, a full collection walks only what the loop made since, not a
        # pause of ~20 ms in the middle of a lease round (and a forked pool child shares those pages).
        gc.freeze()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        prefetch = self.capacity - self.options.concurrency
        self.pool = self.pool or make_pool(
            self.options.pool, self.options.concurrency, backlog=prefetch, warm_ups=warm_ups_for(self.queues)
        )
        self.pool.start()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        if self.replaces:  # blocked across the exec that started this process: a signal meanwhile arrives now
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        logger.info(
            "worker started %s",
            fields(
                worker_id=self.worker_id,
                queues=",".join(self.row.queues),
                concurrency=self.options.concurrency,
                pool=self.options.pool,
                tasks=len(registered_tasks()),
                **({"replaces": self.replaces} if self.replaces else {}),
            ),
        )
        try:
            while not self._finished():
                self._step()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._close()
        return REPLACE if self.replacing else 0

    def _wake(self) -> None:
        """Make the loop's wait return now (from another thread, or a signal handler)."""
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: run() has not made the pipe yet
            os.write(self._wake_w, b"!")

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stopping and not self.replacing:
            logger.warning("second %s: exiting at once; leases in flight expire and their items come back", name)
            if self.pool is not None:
                self.pool.kill()
            os._exit(1)
        self.stopping = True
        self.replacing = False  # asked to stop: the process ends rather than being replaced
        self.release_held = True
        self.grace_deadline = time.monotonic() + self.options.grace_period
        self.next_heartbeat = 0.0  # say "stopping" in the Worker row now
        logger.info(
            "%s: stopping %s",
            name,
            fields(in_flight=len(self.running), grace_period=f"{self.options.grace_period:g}s"),
        )
        self._wake()

    def _replace_when_settled(self) -> None:
        """A handler thread is stuck past its hard timeout (its attempt is settled as timed out, its late
        outcome ignored): stop leasing, hand back the items held and not started, let the others in flight
        finish and settle (or reach their own timeouts), then have run_worker replace the process
        (worker/replace.py). Said once."""
        if self.stopping:
            return  # the process ends anyway (a signal, --max-items, --burst), and the thread with it
        self.stopping = self.replacing = self.release_held = True
        self.next_heartbeat = 0.0  # say "stopping" in the Worker row now
        logger.warning(
            "a handler thread is stuck past its hard timeout and cannot be stopped: no more leases; replacing this "
            "worker process once the other items in flight have settled %s",
            fields(in_flight=len(self.running), held=len(self.leased)),
        )

    def _finished(self) -> bool:
        if not self.stopping:
            if self.options.burst and self.idle_after_lease:
                logger.info("burst: nothing ready and nothing in flight; stopping")
                self.stopping = True
            elif self.options.max_items is not None and self.taken >= self.options.max_items:
                logger.info("max items reached; finishing the items in flight, then stopping")
                self.stopping = True
        if not self.stopping or self.running or self.leased or self.lease_call.busy:
            return False  # a lease in flight: its items are started (or, on a signal, released) first
        if not (self.done or self.pending):
            return True
        down_for = 0.0 if self.db_down_since is None else time.monotonic() - self.db_down_since
        if down_for >= max(self.options.grace_period, 5.0):
            logger.warning(
                "exiting with %d settles unwritten (database unavailable); their items come back when their "
                "leases expire",
                len(self.done) + len(self.pending),
            )
            return True
        return False

    def _close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        self.lease_call.close()
        self.listener.close()
        try:
            engine.save_worker(self.row, "stopped", self.stats.as_dict())
        except DATABASE_DOWN as exc:
            logger.warning("could not mark the worker stopped: %s", exc)
        self.status.close()
        logger.info("worker stopped %s", fields(worker_id=self.worker_id, **self.stats.as_dict()))
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the loop -------------------------------------------------------------------------------------------

    def _step(self) -> None:
        now = time.monotonic()
        late = now - self.waited_from - self.waited_for  # beyond the last step's work and its planned wait
        if late > AWAY_AFTER:
            logger.warning("worker was away %s", fields(seconds=f"{late:.1f}"))
            self.away = True
        self.waited_from, self.waited_for = now, 0.0
        finished = 0
        for outcome in self.pool.collect():
            self._finish(outcome)
            finished += 1
        self._measure_pace(now, finished)
        self._enforce_deadlines()
        self._database_round()
        self.status.tick(
            self.stats,
            in_flight=len(self.running),
            state="stopping" if self.stopping else "running",
            db_ok=self.db_down_since is None,
        )
        if not self._finished():
            self._wait()

    def _measure_pace(self, now: float, finished: int) -> None:
        self.pace_count += finished
        if now - self.pace_since >= PACE_EVERY:
            recent = self.pace_count / (now - self.pace_since)
            self.pace = (self.pace + recent) / 2 if self.pace else recent
            self.pace_count, self.pace_since = 0, now

    def _held_most(self) -> int:
        """Running plus held items at most: the slots, and of the prefetch, --hold seconds of work at the pace
        the pool keeps, never less than --concurrency (the default prefetch: unchanged) so the pace can grow;
        the whole prefetch while it works through a backlog (BACKLOG_AFTER).
        Under a steady load the first worker woken would otherwise lease each burst whole and work through it
        alone while the others idle: its last items waited 50-60 ms in hand (p99) at 11,000 items/s with
        --prefetch 500 on two workers; 26-38 ms held to 25 ms of work, the same end-to-end throughput."""
        concurrency, prefetch = self.options.concurrency, self.capacity - self.options.concurrency
        if not self.options.hold or time.monotonic() - self.ran_dry_at > BACKLOG_AFTER:
            return self.capacity
        return concurrency + min(prefetch, max(concurrency, int(self.pace * self.options.hold)))

    def _room(self) -> int:
        return self._held_most() - len(self.running) - len(self.leased)

    def _free(self) -> int:
        free = self._room()
        if self.options.max_items is not None:
            free = min(free, self.options.max_items - self.taken)
        return max(0, min(free, self.batch))

    def _gathered(self, now: float) -> bool:
        """Time to settle and lease: nothing else runs, or half the room is free, or the first freed slot
        has waited GATHER seconds."""
        if not self.running or self.stopping or self.gather_since is None:
            return True
        return 2 * self._room() >= self._held_most() or now - self.gather_since >= GATHER

    def _should_lease(self, now: float) -> bool:
        if self.stopping or self.lease_call.busy or self._free() == 0:
            return False
        wanted = (
            self.woken
            or self.maybe_more
            or now >= self.next_poll
            or now >= self.wake_at
            or (bool(self.due) and now >= self.due[0])
            or (self.options.burst and not self.running)
        )
        return wanted and self._gathered(now)

    def _settle_due(self, now: float) -> bool:
        if self.lease_call.busy and not self.stopping:
            return bool(self.pending)  # what finishes meanwhile goes with the next lease, right after this one
        return bool(self.pending) or (bool(self.done) and self._gathered(now))

    def _slot_freed(self) -> None:
        if self.gather_since is None:
            self.gather_since = time.monotonic()

    def _wait(self) -> None:
        now = time.monotonic()
        if self.db_down_since is None and self._should_lease(now) and (self.maybe_more or self.woken):
            return  # more work is waiting: do not sleep
        deadlines = [self.next_heartbeat, self.maintenance.next_due(), self.status.next_due(), self.next_deadline]
        leasing = self.lease_call.busy  # its result wakes the loop (the pipe); no other lease until then
        if not self.stopping and not leasing and self._free() > 0:
            # A full worker waits for a slot (the pool's fd says when), not for a poll or a follower's turn that
            # it could not act on: past due, they would make every select() return at once (a busy loop).
            deadlines += [self.next_poll, self.wake_at, *self.due[:1]]
        if self.stopping:
            deadlines.append(self.grace_deadline)
        if self.gather_since is not None and self.running and not leasing:
            deadlines.append(self.gather_since + GATHER)
        if self.db_down_since is not None:
            deadlines.append(self.db_retry_at)
        if not self.listener.connected and not self.stopping:
            deadlines.append(self.listener_retry_at)
        timeout = min(max(0.0, min(deadlines) - now), self.options.poll_interval)
        fds = [self._wake_r, *self.pool.fds()]
        listener_fd = self.listener.fileno()
        if listener_fd is not None:
            fds.append(listener_fd)
        self.waited_from, self.waited_for = time.monotonic(), timeout
        readable, _, _ = select.select(fds, [], [], timeout)
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 64)
        if listener_fd is not None and listener_fd in readable:
            self._drain_listener()

    def _drain_listener(self) -> None:
        """Take in the notifications that arrived: the first worker leases now, a follower a moment later."""
        try:
            notified = self.listener.drain()
        except DATABASE_DOWN as exc:
            self._listener_lost(exc)
            return
        if notified and self.listener.first:
            self.woken = True
        elif notified:
            self.wake_at = min(self.wake_at, time.monotonic() + FOLLOW)

    # -- the database round ---------------------------------------------------------------------------------

    def _database_round(self) -> None:
        now = time.monotonic()
        if self.stopping and self.listener.connected:
            self.listener.close()  # no more leases: hand the wake lock to a follower
        if not self.listener.connected and not self.stopping and now >= self.listener_retry_at:
            try:
                self.listener.connect()
                self.woken = True  # notifications sent while we were not listening are lost
                self.next_first_try = 0.0
            except DATABASE_DOWN as exc:
                self._listener_lost(exc)
        if self.listener.connected and not self.listener.first and now >= self.next_first_try:
            self.next_first_try = now + self.options.poll_interval
            try:
                self.listener.try_first()
            except DATABASE_DOWN as exc:
                self._listener_lost(exc)
            else:
                self._drain_listener()  # what arrived during that statement waits in psycopg, not the socket
        if now < self.db_retry_at:
            return
        try:
            self._database_steps(now)
        except DATABASE_DOWN as exc:
            self._database_down(exc)
        else:
            if self.db_down_since is not None:
                logger.warning("database back %s", fields(after=f"{time.monotonic() - self.db_down_since:.1f}s"))
                self.db_down_since = None
                self.db_backoff = BACKOFF_FIRST

    def _database_steps(self, now: float) -> None:
        if not self.registered:
            engine.save_worker(self.row, "running", self.stats.as_dict())
            self.registered = True
        self._take_leased(now)
        if self.away or self.db_down_since is not None:
            # Back from a freeze or an outage: first settle the results held meanwhile and renew the leases
            # held (dropping prefetched items whose lease was taken back), so that neither this worker's own
            # rescue nor a start of a prefetched item acts on a lease that is no longer ours.
            self._complete_done()
            self._heartbeat()
            self.away = False
        if self.release_held:
            # An at-most-once item was recorded as started before it was handed over: taken back, it would never
            # run. It stays with its thread (one was idle when it was handed over, if maybe still connecting).
            started = frozenset(r for r, run in self.running.items() if run.task.delivery is Delivery.AT_MOST_ONCE)
            for reservation_id in self.pool.take_back(keep=started):  # queued in the pool, never started
                self._release_later(self.running.pop(reservation_id).lease)
        if self.release_held and self.leased:
            for lease, _ in self.leased:
                self._release_later(lease)
            self.leased = []
        if self.pending:
            self._settle_pending()
        self._start_leased()
        if now >= self.next_heartbeat:
            self._heartbeat()
        if self.done and self.maintenance.next_due() <= now:
            self._complete_done()  # what this worker holds is settled before its rescue may expire it
        self.maintenance.run_due()  # before the lease: a schedule it fires is leased in this round
        if self._should_lease(now):
            self._lease(now)  # completes what finished in the same round trip
            self._take_leased(now)  # at once when it ran here
            self._start_leased()
        elif self._settle_due(now):
            self._complete_done()

    def _lease(self, now: float) -> None:
        """Send the settle-and-lease statement (what finished, and as many items as there is room for) to the
        lease thread; the loop goes on and takes its result in a later round (_take_leased). No other lease is
        sent until then."""
        want = self._free()
        sent, self.done = self.done, []
        # Nothing in hand or in the pool: no work to overlap with the statement, so run it here, sparing an
        # idle worker's first item the hand-over to the lease thread and back.
        here = not (self.running or self.leased)
        self.lease_call.send(sent, self.queues, want, self.worker_id, self.terms, here=here)
        self.woken = False
        self.wake_at = float("inf")
        while self.due and self.due[0] <= now:
            heapq.heappop(self.due)
        self.gather_since = None
        self.next_poll = now + self.options.poll_interval

    def _take_leased(self, now: float) -> None:
        """Take the lease thread's result, if one is there: count what it settled, hold what it leased. A failed
        call gives its outcomes back to `done` (to be settled again: fenced) and raises its exception here, where
        a lost database is handled as for any statement of the loop."""
        result = self.lease_call.take()
        if result is None:
            return
        out, error = result
        sent, want = self.lease_call.sent, self.lease_call.asked
        if error is not None:
            self.done[:0] = sent
            self.woken = True  # the lease did not happen: try again as soon as the database allows
            raise error
        leases = out.leases
        self.taken += len(leases)
        self.maybe_more = len(leases) == want
        if not self.maybe_more:
            self.ran_dry_at = now  # the queues had fewer ready than asked: no backlog
        self._completed(out.stale, sent)  # after the wake-up flags: a completed item's key may wake the next lease
        self.idle_after_lease = not leases and not (self.running or self.leased or self.done or self.pending)
        for lease in leases:
            task = find_task(lease.task)
            if task is None:
                self._poison(lease, f"unknown task: {lease.task}")
                continue
            if task.problems():  # a task found by a resolver, not checked at start-up
                self._poison(lease, f"task cannot run: {task.problems()[0]}")
                continue
            if task.decode is not None:
                try:
                    task.decode(lease.payload)
                except Exception as exc:
                    self._poison(lease, f"undecodable payload: {type(exc).__name__}: {exc}")
                    continue
            self.leased.append((lease, task))

    def _start_leased(self) -> None:
        """Start as many held items as there are idle slots: give an item whose task the lease statement did not
        know (found by a resolver) its task's lease, record the at-most-once ones as started, then run them."""
        starting: list[tuple[Lease, Task]] = []
        room, free_threads = self.pool.idle(), self.pool.idle_threads()
        for lease, task in self.leased:
            # An at-most-once item is recorded as started before it runs: hand it over only to a thread that
            # starts it at once, never to a queue where a shutdown could take it back and never run it.
            if len(starting) >= room or (task.delivery is Delivery.AT_MOST_ONCE and free_threads <= 0):
                break
            starting.append((lease, task))
            free_threads -= 1
        if not starting:
            return
        renew = [
            LeaseTerms(lease, task.lease_timeout, task.min_lease)
            for lease, task in starting
            if lease.task not in self.terms
        ]
        current = engine.renew_leases(renew, keep_longer=False, tolerance=0.5)
        at_most_once = [lease for lease, task in starting if task.delivery is Delivery.AT_MOST_ONCE]
        stale = {lease.reservation_id for lease in engine.start_at_most_once(at_most_once)}
        self.leased = self.leased[len(starting) :]
        now = time.monotonic()
        timed: set[str] = set()  # tasks whose hard timeout and lease this batch has counted (once a task)
        running, submit, worker_id = self.running, self.pool.submit, self.worker_id
        for lease, task in starting:
            if lease.reservation_id in stale:
                self._stale(lease, "recording the at-most-once start found the reservation gone; not run")
                continue
            if lease.task not in self.terms and lease.reservation_id not in current:
                self._stale(lease, "the reservation was lost before the handler started; not run")
                continue
            running[lease.reservation_id] = Running(lease, task)
            if lease.task not in timed:
                timed.add(lease.task)
                self.next_deadline = min(self.next_deadline, now + min(task.hard_timeout, DEADLINE_RECHECK))
                self.heartbeat_every = min(self.heartbeat_every, (task.lease_timeout or task.min_lease) / 3)
            # Positional: a named tuple built from keywords costs twice as much (one per item).
            submit(
                Job(
                    lease.reservation_id,
                    lease.item_id,
                    lease.queue,
                    lease.task,
                    lease.payload,
                    lease.attempt,
                    lease.max_attempts,
                    worker_id,
                )
            )

    def _heartbeat(self) -> None:
        held = list(self.running.values())
        terms = [LeaseTerms(r.lease, r.task.lease_timeout, r.task.min_lease) for r in held]
        terms += [LeaseTerms(lease, task.lease_timeout, task.min_lease) for lease, task in self.leased]
        current = engine.renew_leases(terms, keep_longer=True)
        lost = [(lease, task) for lease, task in self.leased if lease.reservation_id not in current]
        for lease, _ in lost:  # cancelled or taken again while waiting in hand: never start it
            self._stale(lease, "lease lost or item cancelled before the handler started; not run")
        self.leased = [(lease, task) for lease, task in self.leased if lease.reservation_id in current]
        for running in held:
            # A transactional handler that looks stale has committed already (its settle is in its
            # transaction) or will find out itself under its row lock: never kill it for that.
            if running.lease.reservation_id in current or running.task.delivery is Delivery.TRANSACTIONAL:
                continue
            self.pool.stop(running.lease.reservation_id)
            del self.running[running.lease.reservation_id]
            self._slot_freed()
            self._stale(running.lease, "lease lost or item cancelled while running; handler stopped")
        engine.save_worker(self.row, "stopping" if self.stopping else "running", self.stats.as_dict())
        self.next_heartbeat = time.monotonic() + self.heartbeat_every

    # -- outages --------------------------------------------------------------------------------------------

    def _database_down(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.db_down_since is None:
            self.db_down_since = now
            self.db_backoff = BACKOFF_FIRST
            logger.warning("database unavailable; retrying with backoff %s", fields(error=repr(str(exc)[:200])))
        else:
            self.db_backoff = min(BACKOFF_MAX, self.db_backoff * 2)
        self.db_retry_at = now + self.db_backoff
        for conn in connections.all(initialized_only=True):
            try:
                conn.close()
            except Exception:  # closing a broken connection may raise; it is gone either way
                logger.debug("closing a broken connection failed", exc_info=True)
        self._listener_lost(exc)

    def _listener_lost(self, exc: BaseException) -> None:
        self.listener.close()
        self.listener_retry_at = time.monotonic() + max(self.db_backoff, BACKOFF_FIRST)
