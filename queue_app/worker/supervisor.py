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

Layout: one file owns each piece of the worker's state. Here: the loop, what is leased, held and running, the
leases' renewal (heartbeats), hard timeouts and wake-ups. The options and small records in options.py; what
becomes of each outcome (complete, retry, dead letter, release), the settles waiting and the counters in
settling.py (the Settler, a collaborator); the database's outages in outage.py; how much work to hold in
pacing.py; whether and how to stop in shutdown.py.

Outages: every database round is guarded; on a lost connection the supervisor logs once, backs off (0.5 s
doubling to 10 s) and retries, keeping finished outcomes in memory; they are settled when the server is back
(settles are fenced, so a lease lost meanwhile is reported stale and changes nothing).

A thread-pool handler stuck past its hard timeout: its attempt is settled as timed out, the worker stops
leasing, lets the rest settle, and run() returns REPLACE for run_worker to exec itself again (worker/replace.py).
"""

import contextlib
import gc
import logging
import os
import secrets
import select
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .. import engine, stages
from ..conf import queue_settings
from ..engine import ALL_QUEUES, Lease, LeaseTerms, tracing
from ..logcontext import attempt_ids, bind_process
from ..registry import Delivery, Task, find_task, registered_tasks, warm_ups_for
from .execute import Job, Outcome
from .leasing import LeaseCall
from .listener import FOLLOW, Listener
from .maintenance import Maintenance
from .options import DATABASE_DOWN, DEADLINE_RECHECK, Running, WorkerOptions
from .outage import Outage
from .pacing import Pacing
from .pool import Pool, make_pool
from .replace import REPLACE, STOP_SIGNALS, replaced
from .settling import Settler
from .shutdown import Shutdown
from .status import Stats, StatusReporter, fields

logger = logging.getLogger("jobsite.worker")

HEARTBEAT_MAX = 10.0  # seconds between heartbeats at most; less when the shortest lease asks for it
# While other items still run, a freed slot and its finished item wait up to this long for company, so settles
# and leases go in batches rather than one round trip per item.
GATHER = 0.005
# Connections a worker opens beyond its own and one per pool slot: its LISTEN connection, its lease thread's
# (worker/leasing.py), and its maintenance thread's (archive, prunes, VACUUM or ANALYZE: worker/maintenance.py)
# while one runs.
OTHER_CONNECTIONS = 3
# A loop iteration that began this much later than the previous one ended (beyond its longest wait) means the
# worker was away: frozen (SIGSTOP, a paused VM), or stuck in a blocking call. Its leases may have lapsed.
AWAY_AFTER = 2.0


class Supervisor:
    def __init__(self, options: WorkerOptions, pool: Pool | None = None) -> None:
        self.options = opts = options
        self.pool = pool
        self.worker_id = opts.worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        bind_process(worker_id=self.worker_id)  # every log line of the process names its worker (logcontext.py)
        self.queues = None if opts.queues is None or tuple(opts.queues) == ALL_QUEUES else list(opts.queues)
        self.pacing = Pacing(opts.concurrency, opts.prefetch, opts.hold)
        self.batch = opts.batch or self.pacing.capacity
        self.terms: engine.Terms = {}
        self.row = engine.WorkerRow(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=list(ALL_QUEUES) if self.queues is None else self.queues,
            concurrency=opts.concurrency,
            started_at=datetime.now(UTC),
        )
        self.listener = Listener(self.queues, self.worker_id)
        self.settler = Settler(self._unblocked)
        self.maintenance = Maintenance(scheduler=opts.scheduler, stats=self.settler.stats, holder=self.worker_id)
        self.status = StatusReporter()
        self.running: dict[int, Running] = {}
        self.next_deadline = float("inf")  # no running item's hard timeout is earlier (may be early: then rechecked)
        self.leased: list[tuple[Lease, Task]] = []  # leased, not started yet
        # Chunked tasks (Task.chunk): when the oldest held item of each began waiting for its chunk to fill.
        self.chunk_since: dict[str, float] = {}
        # The settle-and-lease statement runs on a thread of its own while the loop goes on (worker/leasing.py).
        self.lease_call = LeaseCall(self._wake)
        handed = replaced()  # from the process this one replaced (worker/replace.py), if any
        self.replaces = handed.get("worker_id")
        self.taken = int(handed.get("taken", 0))  # --max-items counts on across a replacement
        self.shutdown = Shutdown()
        self.outage = Outage()
        self.registered = False
        self.woken = True
        self.maybe_more = True
        self.next_poll = 0.0
        self.next_heartbeat = 0.0
        self.gather_since: float | None = None  # when the first slot freed since the last lease
        self.wake_at = float("inf")  # a follower's lease after a notification (see worker/listener.py)
        self.next_first_try = 0.0  # a follower's next try for the wake duty (a leader row)
        self.idle_after_lease = False  # --burst: a lease found nothing, nothing is in flight, and nothing is ready
        self.said_held_back = False
        self.heartbeat_every = self._heartbeat_cap()
        self.away = False  # the loop was away (frozen, cut off): check leases and settle before anything else
        self.waited_from, self.waited_for = time.monotonic(), 0.0  # the last wait: since when, for how long
        self.woken_at = 0.0  # the last notification's arrival (queue_app/stages.py, when on)

    @property
    def stats(self) -> Stats:
        return self.settler.stats

    def row_stats(self) -> dict[str, object]:
        """The Worker row's stats: the counters, and how this worker learns of new items (wakeup: listen, or poll
        behind a transaction pooler without LISTEN_DATABASE_URL) with its poll interval (the admin, /metrics)."""
        return {**self.stats.as_dict(), "wakeup": self.listener.mode, "poll_interval": self.options.poll_interval}

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
        self.pacing = Pacing(opts.concurrency, opts.prefetch, opts.hold)
        self.batch = opts.batch or self.pacing.capacity
        self.row = replace(self.row, concurrency=concurrency)

    def run(self) -> int:
        engine.engine_session_here()  # this thread's connections are the worker's own (engine/db.py)
        self.check()
        self.check_connection_room()
        # Everything loaded so far (Django, the apps, every task module: ~86,000 objects) lives as long as the
        # process: out of the collector's sight, a full collection walks only what the loop made since, not a
        # pause of ~20 ms in the middle of a lease round (and a forked pool child shares those pages).
        gc.freeze()
        stages.configure()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.pool = self.pool or make_pool(
            self.options.pool,
            self.options.concurrency,
            backlog=self.pacing.prefetch,
            warm_ups=warm_ups_for(self.queues),
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
        self._say_pooler()
        if not self.listener.listening:
            logger.info(
                "wake-ups: polling every %s s, not listening: CONNECTION_POOLER=transaction and no "
                "LISTEN_DATABASE_URL (a LISTEN through the pooler would be dropped); set LISTEN_DATABASE_URL to a "
                "URL past the pooler for prompt wake-ups",
                self.options.poll_interval,
            )
        try:
            while not self._finished():
                self._step()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._close()
        return REPLACE if self.shutdown.replacing else 0

    def _say_pooler(self) -> None:
        """Say at start what the worker does about a connection pooler, and warn when one seems to sit in between
        (the port connected to is not the server's) while CONNECTION_POOLER is unset."""
        try:
            ports = engine.pooler.port_differs()
        except DATABASE_DOWN:
            return
        if engine.pooler.pooled():
            logger.info(
                "CONNECTION_POOLER=transaction: statements unprepared, no session settings or session locks; "
                "wake-ups %s",
                "by LISTEN on LISTEN_DATABASE_URL" if self.listener.listening else "by polling",
            )
        elif ports is not None:
            logger.warning(
                "connected to port %d, the server listens on %d: a connection pooler may sit in between; if it pools "
                "by transaction, set CONNECTION_POOLER=transaction (and LISTEN_DATABASE_URL past it)",
                *ports,
            )

    def _wake(self) -> None:
        """Make the loop's wait return now (from another thread, or a signal handler)."""
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: run() has not made the pipe yet
            os.write(self._wake_w, b"!")

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.shutdown.stopping and not self.shutdown.replacing:
            logger.warning("second %s: exiting at once; leases in flight expire and their items come back", name)
            if self.pool is not None:
                self.pool.kill()
            os._exit(1)
        self.shutdown.asked(self.options.grace_period)
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
        if not self.shutdown.replace():
            return  # the process ends anyway (a signal, --max-items, --burst), and the thread with it
        self.next_heartbeat = 0.0  # say "stopping" in the Worker row now
        logger.warning(
            "a handler thread is stuck past its hard timeout and cannot be stopped: no more leases; replacing this "
            "worker process once the other items in flight have settled %s",
            fields(in_flight=len(self.running), held=len(self.leased)),
        )

    def _finished(self) -> bool:
        if not self.shutdown.stopping:
            if self.options.burst and self.idle_after_lease:
                logger.info("burst: nothing ready and nothing in flight; stopping")
                self.shutdown.finish_in_hand()
            elif self.options.max_items is not None and self.taken >= self.options.max_items:
                logger.info("max items reached; finishing the items in flight, then stopping")
                self.shutdown.finish_in_hand()
        if not self.shutdown.stopping or self.running or self.leased or self.lease_call.busy:
            return False  # a lease in flight: its items are started (or, on a signal, released) first
        if not self.settler.unsettled():
            return True
        if self.outage.down_for(time.monotonic()) >= max(self.options.grace_period, 5.0):
            logger.warning(
                "exiting with %d settles unwritten (database unavailable); their items come back when their "
                "leases expire",
                self.settler.unsettled(),
            )
            return True
        return False

    def _close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        self.lease_call.close()
        # What is left of a signal's grace period (the whole period after --burst or --max-items), 1 s at least.
        left = min(self.options.grace_period, self.shutdown.grace_deadline - time.monotonic())
        if not self.maintenance.close(max(left, 1.0)):
            logger.warning("the maintenance thread's statement is still running; the process's exit cuts it")
        if stages.on:
            stages.flush()  # the loop's stamps and its pool threads' (a child writes its own)
        self.listener.close()
        try:
            if self.listener.handed:  # an offer taken as it was withdrawn: back to ready now, not at its lapse
                for lease in self.listener.take_handed():
                    self.settler.release(lease)
                self.settler.settle_pending()
            engine.leaders.release(self.worker_id)  # every duty still held (renewed by the heartbeat)
            engine.save_worker(self.row, "stopped", self.row_stats())
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
        self.pacing.finished(now, finished)
        self._enforce_deadlines()
        self._database_round()
        self.status.tick(
            self.stats,
            in_flight=len(self.running),
            state="stopping" if self.shutdown.stopping else "running",
            db_ok=not self.outage.down,
        )
        if not self._finished():
            self._wait()

    def _finish(self, outcome: Outcome) -> None:
        running = self.running.pop(outcome.reservation_id, None)
        if running is None:  # already stopped (hard timeout, stale) and accounted for
            return
        self._slot_freed()
        self.settler.finish(running, outcome)

    def _room(self) -> int:
        """Items this worker may take on now: an offer of a hand-off (worker/listener.py) holds one of them."""
        offered = 1 if self.listener.offer_id is not None else 0
        return self.pacing.held_most() - len(self.running) - len(self.leased) - offered

    def _free(self) -> int:
        free, batch = self._room(), self.batch
        if self.chunk_since and self.leased:
            # A partial chunk waiting to fill may lease up to what it lacks, whatever the pacing holds.
            lacking = self._chunk_lacking()
            free, batch = max(free, lacking), max(batch, lacking)
        if self.options.max_items is not None:
            free = min(free, self.options.max_items - self.taken)
        return max(0, min(free, batch))

    def _chunk_lacking(self) -> int:
        """The most items a held chunked task lacks to fill its chunk."""
        held: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for _, task in self.leased:
            if task.chunk is not None:
                held[task.name] = held.get(task.name, 0) + 1
                sizes[task.name] = task.chunk.size
        return max((sizes[name] - held[name] % sizes[name]) % sizes[name] for name in held) if held else 0

    def _gathered(self, now: float) -> bool:
        """Time to settle and lease: nothing else runs, or half the room is free, or the first freed slot
        has waited GATHER seconds."""
        if not self.running or self.shutdown.stopping or self.gather_since is None:
            return True
        return 2 * self._room() >= self.pacing.held_most() or now - self.gather_since >= GATHER

    def _should_lease(self, now: float) -> bool:
        if self.shutdown.stopping or self.lease_call.busy or self._free() == 0:
            return False
        wanted = (
            self.woken
            or self.maybe_more
            or now >= self.next_poll
            or now >= self.wake_at
            or now >= self.settler.next_due()
            or (self.options.burst and not self.running)
        )
        return wanted and self._gathered(now)

    def _settle_due(self, now: float) -> bool:
        pending, done = self.settler.pending, self.settler.done
        if self.lease_call.busy and not self.shutdown.stopping:
            return bool(pending)  # what finishes meanwhile goes with the next lease, right after this one
        return bool(pending) or (bool(done) and self._gathered(now))

    def _slot_freed(self) -> None:
        if self.gather_since is None:
            self.gather_since = time.monotonic()

    def _wait(self) -> None:
        now = time.monotonic()
        if not self.outage.down and self._should_lease(now) and (self.maybe_more or self.woken):
            return  # more work is waiting: do not sleep
        deadlines = [self.next_heartbeat, self.maintenance.next_due(), self.status.next_due(), self.next_deadline]
        leasing = self.lease_call.busy  # its result wakes the loop (the pipe); no other lease until then
        if not self.shutdown.stopping and not leasing and self._free() > 0:
            # A full worker waits for a slot (the pool's fd says when), not for a poll or a follower's turn that
            # it could not act on: past due, they would make every select() return at once (a busy loop).
            deadlines += [self.next_poll, self.wake_at, self.settler.next_due()]
        if self.shutdown.stopping:
            deadlines.append(self.shutdown.grace_deadline)
        if self.gather_since is not None and self.running and not leasing:
            deadlines.append(self.gather_since + GATHER)
        if self.chunk_since and self.leased:
            deadlines.append(self._chunk_due())
        if self.outage.down:
            deadlines.append(self.outage.retry_at)
        if self.listener.listening and not self.listener.connected and not self.shutdown.stopping:
            deadlines.append(self.outage.listener_retry_at)
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

    def _on_listener(self, statement: Callable[[], object]) -> None:
        """Run one of the listener's statements (an offer, its withdrawal, a take of the wake duty), then drain.
        PostgreSQL sends the notifications that arrive during a statement before its result, so psycopg reads
        them off the socket with it and keeps them: select() would not wake for them, and the worker would sleep
        on a queue's wake-up, or on a lease an enqueue handed it (one that took the offer being withdrawn), until
        its next deadline."""
        try:
            statement()
        except DATABASE_DOWN:
            self._listener_lost()
        else:
            self._drain_listener()

    def _drain_listener(self) -> None:
        """Take in the notifications that arrived: the first worker leases now, a follower a moment later."""
        try:
            notified = self.listener.drain()
        except DATABASE_DOWN:
            self._listener_lost()
            return
        if self.listener.handed:
            self._hold_handed()
        if notified and stages.on:
            self.woken_at = time.time()
        if notified and self.listener.first:
            self.woken = True
        elif notified:
            self.wake_at = min(self.wake_at, time.monotonic() + FOLLOW)

    # -- the database round ---------------------------------------------------------------------------------

    def _database_round(self) -> None:
        now = time.monotonic()
        if self.shutdown.stopping and self.listener.connected:
            self.listener.close()  # no more leases: hand the wake duty to a follower, withdraw the offer
            if self.listener.handed:
                self._hold_handed()  # an offer taken as it was withdrawn: released
        if (
            self.listener.listening
            and not self.listener.connected
            and not self.shutdown.stopping
            and now >= self.outage.listener_retry_at
        ):
            try:
                self.listener.connect()
                self.woken = True  # notifications sent while we were not listening are lost
                self.next_first_try = 0.0
            except DATABASE_DOWN:
                self._listener_lost()
        if self.listener.connected and not self.listener.first and now >= self.next_first_try:
            self.next_first_try = now + self.options.poll_interval
            self._on_listener(self.listener.try_first)
        if now < self.outage.retry_at:
            return
        try:
            self._database_steps(now)
        except DATABASE_DOWN as exc:
            self.outage.lost(exc)
            self.listener.close(release=False)
        else:
            self.outage.back()

    def _database_steps(self, now: float) -> None:
        if not self.registered:
            engine.save_worker(self.row, "running", self.row_stats())
            self.registered = True
        self._take_leased(now)
        if self.away or self.outage.down:
            # Back from a freeze or an outage: first settle the results held meanwhile and renew the leases
            # held (dropping prefetched items whose lease was taken back), so that neither this worker's own
            # rescue nor a start of a prefetched item acts on a lease that is no longer ours.
            self.settler.complete_done()
            self._heartbeat()
            self.away = False
        if self.shutdown.release_held:
            # An at-most-once item was recorded as started before it was handed over: taken back, it would never
            # run. It stays with its thread (one was idle when it was handed over, if maybe still connecting).
            started = frozenset(r for r, run in self.running.items() if run.task.delivery is Delivery.AT_MOST_ONCE)
            for reservation_id in self.pool.take_back(keep=started):  # queued in the pool, never started
                for lease in self.running.pop(reservation_id).leases:
                    self.settler.release(lease)
        if self.shutdown.release_held and self.leased:
            for lease, _ in self.leased:
                self.settler.release(lease)
            self.leased = []
        if self.settler.pending:
            self.settler.settle_pending()
        self._start_leased()
        if now >= self.next_heartbeat:
            self._heartbeat()
        if self.settler.done and self.maintenance.next_due() <= now:
            self.settler.complete_done()  # what this worker holds is settled before its rescue may expire it
        self.maintenance.run_due()  # before the lease: a schedule it fires is leased in this round
        if self.listener.offer_id is not None and self._offer_in_the_way(now):
            self._withdraw()
        if self._should_lease(now):
            self._lease(now)  # completes what finished in the same round trip
            self._take_leased(now)  # at once when it ran here
            self._start_leased()
        elif self._lease_beside_due(now):
            self._lease_beside(now)
            self._start_leased()
        elif self._settle_due(now):
            self._settle()
        if self._offer_due():
            self._offer()

    # -- hand-off (engine/handoff.py) ------------------------------------------------------------------------

    def _offer_due(self) -> bool:
        """Offer a slot to the next plain enqueue when this worker is idle and its queues have nothing ready: its
        last lease found fewer items than it asked for, none is held or running (the offer's round trip never
        holds up a handler's start), a thread (or child) waits, and no lease or wake-up is pending."""
        listener = self.listener
        return (
            listener.channel is not None
            and listener.offer_id is None
            and listener.connected
            and not self.shutdown.stopping
            and not self.options.burst
            and not self.outage.down
            and not (self.maybe_more or self.woken or self.leased or self.running or self.lease_call.busy)
            and self.wake_at == float("inf")
            and self.registered
            and self.pool.idle() > 0
            and self.pool.idle_threads() > 0
            and self._free() > 0
        )

    def _offer(self) -> None:
        self._on_listener(lambda: self.listener.offer(self.terms))

    def _offer_in_the_way(self, now: float) -> bool:
        """The offer holds the one slot a lease that is due could use (a queue notification, a poll): take it
        back, so the item waiting is leased (an enqueue that took it meanwhile hands its item over all the
        same)."""
        wanted = self.woken or self.maybe_more or now >= self.next_poll or now >= self.wake_at
        return wanted and self._free() == 0 and self._room() + 1 > 0 and not self.lease_call.busy

    def _withdraw(self) -> None:
        self._on_listener(self.listener.withdraw)

    def _hold_handed(self) -> None:
        """Hold the leases enqueues handed over (their notifications drained): started in this round like leased
        items, with nothing asked of the database."""
        handed = self.listener.take_handed()
        if self.shutdown.stopping:  # taken as the offer was withdrawn: back to ready at once
            for lease in handed:
                self.settler.release(lease)
            return
        if stages.on:
            at = time.time()
            for lease in handed:
                stages.leased([lease], at, at, at, 1, "handoff")  # its notification drained
        self.taken += len(handed)
        self.stats.handed_off += len(handed)
        self._hold(handed, time.monotonic())
        # At once, from the wait that drained the notification. A database lost meanwhile: they stay held, and
        # the loop's database round meets the outage and starts them once it is over.
        with contextlib.suppress(*DATABASE_DOWN):
            self._start_leased()
        # Let the woken thread take the GIL now: the loop's next round is Python for half a millisecond or more
        # (pickup 0.86 ms at p50 before this line, 0.12 after; a lease's own round trip releases it anyway).
        time.sleep(0)

    def _settle(self) -> None:
        """Complete what finished, no lease due: on the lease thread (a settle-and-lease that asks for nothing),
        so the loop stays free to answer a notification meanwhile (_lease_beside); in the loop when stopping."""
        if self.shutdown.stopping or self.lease_call.busy:
            self.settler.complete_done()
            return
        self.lease_call.send(self.settler.take_done(), self.queues, 0, self.worker_id, self.terms)

    def _lease_beside_due(self, now: float) -> bool:
        """The latency path: a notification came while the lease thread only settles (its call asks for no
        items), and a slot waits idle with nothing held for it. Then the lease need not wait for that settle."""
        call = self.lease_call
        return (
            call.busy
            and call.asked == 0
            and (self.woken or now >= self.wake_at)
            and not self.leased
            and not self.shutdown.stopping
            and self.pool.idle_threads() > 0
            and self._free() > 0
        )

    def _lease_beside(self, now: float) -> None:
        """Lease in the loop, on its own connection, beside the lease thread's settle in flight (_lease_beside_due):
        nothing settled, so a failure gives nothing back; the next notification or poll leases again."""
        want = self._free()
        woken_at = (self.woken_at if self.woken or now >= self.wake_at else 0.0) if stages.on else 0.0
        sent_at = time.time() if stages.on else 0.0
        self.woken, self.wake_at = False, float("inf")
        self.settler.forget_due(now)
        self.next_poll = now + self.options.poll_interval
        try:
            out = engine.settle_and_lease(
                [], self.queues, want, self.worker_id, terms=self.terms, traced=self.lease_call.traced
            )
        except BaseException:
            self.woken = True  # try again as soon as the database allows
            raise
        if stages.on:
            stages.leased(out.leases, woken_at, sent_at, time.time(), want, "beside")
            self.woken_at = 0.0
        self._took(out, [], want, now)

    def _lease(self, now: float) -> None:
        """Send the settle-and-lease statement (what finished, and as many items as there is room for) to the
        lease thread; the loop goes on and takes its result in a later round (_take_leased). No other lease is
        sent until then."""
        want = self._free()
        sent = self.settler.take_done()
        # Nothing in hand or in the pool: no work to overlap with the statement, so run it here, sparing an
        # idle worker's first item the hand-over to the lease thread and back.
        here = not (self.running or self.leased)
        if stages.on:
            self.lease_call.woken_at = self.woken_at if self.woken or now >= self.wake_at else 0.0
            self.woken_at = 0.0
        self.lease_call.send(sent, self.queues, want, self.worker_id, self.terms, here=here)
        self.woken = False
        self.wake_at = float("inf")
        self.settler.forget_due(now)
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
            self.settler.give_back(sent)
            self.woken = True  # the lease did not happen: try again as soon as the database allows
            raise error
        if stages.on and want:
            call = self.lease_call
            stages.leased(out.leases, call.woken_at, call.sent_at, call.leased_at, want, call.path)
        self._took(out, sent, want, now)

    def _took(self, out: engine.SettledAndLeased, sent: list, want: int, now: float) -> None:
        """Count what a settle-and-lease settled, hold what it leased. `want` 0: a settle only (_settle), which
        says nothing about what is ready."""
        leases = out.leases
        self.taken += len(leases)
        if want:
            self.maybe_more = len(leases) == want
            if not self.maybe_more:
                self.pacing.ran_dry(now)  # the queues had fewer ready than asked: no backlog
        # After the wake-up flags: a completed item's key may wake the next lease.
        self.settler.completed(out.stale, sent)
        if want:
            self.idle_after_lease = False
            if self.options.burst and not leases and not (self.running or self.leased or self.settler.unsettled()):
                self.idle_after_lease = not self._held_back()
        self._hold(leases, now)

    def _hold(self, leases: list[Lease], now: float) -> None:
        """Hold leased items to start (a task unknown or unable to run, or a payload its task cannot decode: a
        dead letter at once)."""
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
            if task.chunk is not None:
                self.chunk_since.setdefault(task.name, now)

    def _poison(self, lease: Lease, reason: str) -> None:
        self.settler.poison(lease, reason)
        if tracing.enabled:  # never started: no attempt span, a short one with the dead letter under the enqueue
            tracing.event_span(
                f"poison {lease.task}",
                lease.trace_context,  # tracing on: the traced lease returned it
                "dead_letter",
                **{"jobsite.item_id": lease.item_id, "jobsite.task": lease.task, "jobsite.reason": reason[:500]},
            )

    def _held_back(self) -> bool:
        """--burst, a lease that found nothing with nothing in flight: whether items are ready all the same, held
        back by an ordering key (its next item is leasable from the statement after the settle that freed it,
        or after another worker's item), or a rate, concurrency or group limit. A burst worker then waits and
        leases again (at once after a settle that freed a key, else at the poll interval): it stops only once
        nothing is ready or in flight. Said once a spell."""
        ready = engine.ready_exists(self.queues)
        if ready and not self.said_held_back:
            logger.info("burst: items ready but held back (by an ordering key or a flow limit); waiting")
        self.said_held_back = ready
        return ready

    def _chunk_due(self) -> float:
        """When the first partial chunk held has waited its task's chunk timeout."""
        timeouts = {task.name: task.chunk.timeout for _, task in self.leased if task.chunk is not None}
        due = (since + timeouts[name] for name, since in self.chunk_since.items() if name in timeouts)
        return min(due, default=float("inf"))

    def _units(self, now: float) -> list[list[tuple[Lease, Task]]]:
        """The held items as the pool runs them, in the order held: one item each, or a chunked task's items in
        chunks of its size. A partial chunk waits for more while its timeout runs and the worker may lease more
        (not when it is full or stopping)."""
        units: list[list[tuple[Lease, Task]]] = []
        chunks: dict[str, list[tuple[Lease, Task]]] = {}
        for held in self.leased:
            task = held[1]
            if task.chunk is None:
                units.append([held])
                continue
            chunk = chunks.get(task.name)
            if chunk is None or len(chunk) >= task.chunk.size:
                chunk = chunks[task.name] = []
                units.append(chunk)
            chunk.append(held)
        for name in [name for name in self.chunk_since if name not in chunks]:
            del self.chunk_since[name]  # its held items left otherwise (lost leases, released at shutdown)
        can_wait = not self.shutdown.stopping and self._free() > 0
        for name, last in chunks.items():
            task = last[0][1]
            waited = now - self.chunk_since.get(name, now)
            if len(last) < task.chunk.size and can_wait and waited < task.chunk.timeout:
                units.remove(last)  # the newest, partial chunk of the task: not yet
        return units

    def _start_leased(self) -> None:
        """Start as many held items (or chunks of a chunked task's items: _units) as there are idle slots: give
        an item whose task the lease statement did not know (found by a resolver) its task's lease, record the
        at-most-once ones as started, then run them."""
        now = time.monotonic()
        units: list[list[tuple[Lease, Task]]] = []
        room, free_threads = self.pool.idle(), self.pool.idle_threads()
        if not self.leased:
            self.chunk_since.clear()
        for unit in self._units(now) if self.leased else ():
            task = unit[0][1]
            # An at-most-once item is recorded as started before it runs: hand it over only to a thread that
            # starts it at once, never to a queue where a shutdown could take it back and never run it.
            if len(units) >= room or (task.delivery is Delivery.AT_MOST_ONCE and free_threads <= 0):
                break
            units.append(unit)
            free_threads -= 1
        if not units:
            return
        starting = [held for unit in units for held in unit]
        renew = [
            LeaseTerms(lease, task.lease_timeout, task.min_lease)
            for lease, task in starting
            if lease.task not in self.terms
        ]
        current = engine.renew_leases(renew, keep_longer=False, tolerance=0.5)
        at_most_once = [lease for lease, task in starting if task.delivery is Delivery.AT_MOST_ONCE]
        stale = {lease.reservation_id for lease in engine.start_at_most_once(at_most_once)}
        started_ids = {lease.reservation_id for lease, _ in starting}
        self.leased = [held for held in self.leased if held[0].reservation_id not in started_ids]
        for name in {task.name for _, task in starting if task.chunk is not None}:
            if any(task.name == name for _, task in self.leased):
                self.chunk_since[name] = now  # the items left wait for the next chunk from now
            else:
                self.chunk_since.pop(name, None)
        timed: set[str] = set()  # tasks whose hard timeout and lease this batch has counted (once a task)
        running, submit, worker_id = self.running, self.pool.submit, self.worker_id
        for unit in units:
            good: list[Lease] = []
            for lease, _ in unit:
                if lease.reservation_id in stale:
                    self.settler.stale(lease, "recording the at-most-once start found the reservation gone; not run")
                elif lease.task not in self.terms and lease.reservation_id not in current:
                    self.settler.stale(lease, "the reservation was lost before the handler started; not run")
                else:
                    good.append(lease)
            if not good:
                continue
            lease, task = good[0], unit[0][1]
            parent = None
            if tracing.enabled:  # the attempt's consumer span (a chunk's: its first item's); the handler runs under it
                parent = self._start_span(lease)
            if lease.task not in timed:
                timed.add(lease.task)
                self.next_deadline = min(self.next_deadline, now + min(task.hard_timeout, DEADLINE_RECHECK))
                self.heartbeat_every = min(self.heartbeat_every, (task.lease_timeout or task.min_lease) / 3)
            if task.chunk is not None:
                running[lease.reservation_id] = Running(lease, task, tuple(good))
                members = [(m.reservation_id, m.item_id, m.payload, m.attempt, m.max_attempts) for m in good]
                submit(
                    Job(
                        lease.reservation_id,
                        lease.item_id,
                        lease.queue,
                        lease.task,
                        members,
                        lease.attempt,
                        lease.max_attempts,
                        worker_id,
                        parent,
                        lease.workflow_id,
                        lease.step,
                    )
                )
                continue
            running[lease.reservation_id] = Running(lease, task)
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
                    parent,
                    lease.workflow_id,  # a step's (traced lease only; None otherwise): its log lines say so
                    lease.step,
                )
            )

    def _start_span(self, lease: Lease) -> str | None:
        """Start the attempt's span (a child of the item's stored context); its traceparent for the handler. When
        the sampler dropped it: the item's stored context (None when it has none), which the handler carries on
        unsampled (engine/tracing.py)."""
        span = tracing.start_attempt(lease, lease.trace_context, self.worker_id)
        if span is None:
            return lease.trace_context
        self.settler.spans[lease.reservation_id] = span
        return tracing.traceparent(span)

    def _heartbeat(self) -> None:
        held = list(self.running.values())
        terms = [LeaseTerms(lease, r.task.lease_timeout, r.task.min_lease) for r in held for lease in r.leases]
        terms += [LeaseTerms(lease, task.lease_timeout, task.min_lease) for lease, task in self.leased]
        current = engine.renew_leases(terms, keep_longer=True)
        lost = [(lease, task) for lease, task in self.leased if lease.reservation_id not in current]
        for lease, _ in lost:  # cancelled or taken again while waiting in hand: never start it
            self.settler.stale(lease, "lease lost or item cancelled before the handler started; not run")
        self.leased = [(lease, task) for lease, task in self.leased if lease.reservation_id in current]
        for running in held:
            # A transactional handler that looks stale has committed already (its settle is in its
            # transaction) or will find out itself under its row lock: never kill it for that.
            if running.lease.reservation_id in current or running.task.delivery is Delivery.TRANSACTIONAL:
                continue
            if running.members:  # a chunk runs on for its other items; the lost ones' settles change nothing
                continue
            self.pool.stop(running.lease.reservation_id)
            del self.running[running.lease.reservation_id]
            self._slot_freed()
            self.settler.stale(running.lease, "lease lost or item cancelled while running; handler stopped")
        self.listener.renewed(engine.leaders.renew(self.worker_id))
        engine.save_worker(self.row, "stopping" if self.shutdown.stopping else "running", self.row_stats())
        self.next_heartbeat = time.monotonic() + self.heartbeat_every
        if stages.on:
            stages.flush(stages.FLUSH_AT)

    def _listener_lost(self) -> None:
        self.listener.close(release=False)
        self.outage.listener_lost()
        if self.listener.handed:  # drained before the loss: held as usual
            self._hold_handed()

    def _unblocked(self, queues: set[str]) -> None:
        """Settled items with an ordering key let the next item of their key go (the Settler says so): lease
        again at once rather than at the next poll, and wake the other workers when this one has no room for it."""
        self.woken = True
        if self._free() == 0:
            engine.notify(queues)

    # -- hard timeouts --------------------------------------------------------------------------------------

    def _enforce_deadlines(self) -> None:
        """Stop handlers past their hard timeout (counted from when the pool started them), and everything at
        the end of the grace period. Walks what is in flight only when the earliest deadline may have come."""
        now = time.monotonic()
        out_of_grace = self.shutdown.out_of_grace(now)
        if now < self.next_deadline and not out_of_grace:
            return  # the common case, without a walk over everything in flight
        self.next_deadline = float("inf")
        for reservation_id, running in list(self.running.items()):
            started = self.pool.started_at(reservation_id)
            if started is None:  # waiting in the pool's queue: its clock has not started; look again soon
                self.next_deadline = min(self.next_deadline, now + DEADLINE_RECHECK)
                deadline = float("inf")
            else:
                deadline = started + running.task.hard_timeout
            if now < deadline and not out_of_grace:
                self.next_deadline = min(self.next_deadline, deadline)
                continue
            self.pool.stop(reservation_id)
            del self.running[reservation_id]
            self._slot_freed()
            for lease in running.leases:
                self._stopped(lease, running.task, now, deadline)
            if self.pool.kind == "thread" and now >= deadline:
                self._replace_when_settled()  # the abandoned thread runs on: only a new process ends it

    def _stopped(self, lease: Lease, task: Task, now: float, deadline: float) -> None:
        """Settle an item whose handler was stopped: past its hard timeout, or at the end of the grace period."""
        if self.pool.kind == "thread" and task.delivery is Delivery.TRANSACTIONAL:
            # An abandoned thread keeps its transaction and the item's row lock: a settle from here would
            # wait on that lock. Its transaction settles the item, or rolls back (at the latest when the
            # process is replaced); then the lease expires.
            self.settler.abandoned(lease, timed_out=now >= deadline)
        elif now >= deadline:
            how = "its child process was killed" if self.pool.kind == "process" else "its thread was abandoned"
            error = f"hard timeout: the handler ran longer than {task.hard_timeout:g}s and was stopped ({how})"
            logger.warning(
                "timed out %s",
                fields(item=lease.item_id, task=lease.task, attempt=lease.attempt),
                extra=attempt_ids(lease),
            )
            self.settler.failed(lease, task, error, "", retryable=True, timed_out=True)
        elif task.delivery is Delivery.AT_MOST_ONCE:
            self.settler.failed(lease, task, "the worker shut down before the handler finished", "", False)
        else:
            self.settler.release(lease)
