"""Maintenance duties, each a small unit with one job and its own interval (River's maintenance services):
rescue expired leases, prune done items and dedup claims, archive finished items into the partitioned history
and drop its expired days, vacuum the hot tables when dead rows pile up, analyze them when they outgrow their
statistics, mark where the id sequences stand (engine/marks.py), sweep the Worker rows of dead workers, drop the
workflow events no wait claimed within their lookback, and fire the cron schedules that are due (the scheduler;
off with `run_worker --no-scheduler`).

Every worker carries the units; a unit runs inside a transaction holding its advisory lock
(pg_try_advisory_xact_lock), so one worker at a time does each duty and the others skip it. VACUUM and ANALYZE
cannot hold a transaction open (VACUUM cannot run in one): they run as the leader of the table maintenance duty,
a row (engine/leaders.py), never a session lock. The units whose work may take long (moving or deleting rows in
bulk, VACUUM, ANALYZE) do it in the worker's maintenance thread, never in the supervisor's loop (_Background).
A VACUUM or ANALYZE skipped because another process holds the duty is said at INFO once per SKIP_LOG_EVERY.
"""

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import engine, hooks, scheduling
from ..conf import queue_settings
from ..engine.alias import atomic, connection
from .status import Stats

logger = logging.getLogger("jobsite.worker")

RESCUE_BATCH = 1000
ARCHIVE_BATCH = 5_000
SCHEDULE_BATCH = 100  # due schedules claimed per round
EVENT_DROP_BATCH = 1000  # unclaimed workflow events past their lookback deleted per round
WORKER_FORGET_AFTER = 600.0  # seconds without a heartbeat before a Worker row is deleted
HISTORY_EVERY = 30.0  # seconds between the history unit's turns, at most (_history_unit)
HISTORY_EVERY_LEAST = 1.0  # ... and at least, however short a queue's retention
SKIPPED_AGAIN = 1.0  # seconds until a unit that moves rows comes again when its turn found the thread busy
SKIP_LOG_EVERY = 300.0  # seconds between the lines saying a VACUUM or ANALYZE was skipped (with how many times)


@dataclass
class Unit:
    """One duty. `run` does one bounded round and returns (counts to log, whether a full batch suggests more)."""

    name: str
    every: float
    run: Callable[[], tuple[dict[str, int], bool]]
    due_at: float = 0.0


def _rescue() -> tuple[dict[str, int], bool]:
    rescued, died = engine.rescue_expired(RESCUE_BATCH)
    return {"rescued": rescued, "dead": died}, rescued + died >= RESCUE_BATCH


def _archive() -> tuple[dict[str, int], bool]:
    moved = engine.within_lock_timeout(lambda: engine.archive(ARCHIVE_BATCH), "archive")
    return {"archived": moved}, moved >= ARCHIVE_BATCH


def _log_counts(name: str, counts: dict[str, int]) -> None:
    """One log line for a unit's round (or a _Rows turn) that did something."""
    if any(counts.values()):
        logger.info("maintenance unit=%s %s", name, " ".join(f"{k}={v}" for k, v in counts.items()))


class _Background:
    """A unit whose work may take long, run in a thread of its own so that the supervisor's loop (settles, leases,
    handing items to the pool, hard timeouts, heartbeats) never waits for it. Units given the same `shared` list
    take turns in one thread: a worker opens one connection for them at most (supervisor.OTHER_CONNECTIONS counts
    it). A unit whose thread is busy skips its turn."""

    name: str

    def __init__(self, shared: list[threading.Thread | None] | None) -> None:
        self.shared = [None] if shared is None else shared  # the one thread these units run in, if any
        self.closing = threading.Event()  # set by Maintenance.close: a turn in progress starts no new batch

    @property
    def thread(self) -> threading.Thread | None:
        return self.shared[0]

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread's work (tests)."""
        if self.thread is not None:
            self.thread.join(timeout)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        def run() -> None:
            engine.engine_session_here()  # one of the worker's own threads (engine/db.py)
            target(*args)

        self.shared[0] = threading.Thread(target=run, name=f"jobsite-{self.name}", daemon=True)
        self.shared[0].start()


class _InThread(_Background):
    """A maintenance statement that may take seconds (VACUUM, ANALYZE): `find` says which hot tables need it, `act`
    does it, on a connection of its own."""

    def __init__(
        self,
        name: str,
        find: Callable[[], list[str]],
        act: Callable[[list[str]], dict[str, float] | None],
        shared: list[threading.Thread | None] | None = None,
    ):
        super().__init__(shared)
        self.name, self.find, self.act = name, find, act
        self.skipped = 0  # since the last line that said so
        self.next_skip_log = 0.0

    def __call__(self) -> tuple[dict[str, int], bool]:
        if self.busy():
            return {}, False
        tables = self.find()
        if tables:
            self._start(self._run, tables)
        return {f"{self.name}_started": len(tables)}, False

    def _run(self, tables: list[str]) -> None:
        try:
            took = self.act(tables)
        except Exception as exc:  # e.g. not the tables' owner, or the server went away: say so, try next time
            logger.warning("maintenance unit=%s failed: %s", self.name, exc)
        else:
            if took is None:
                self._skipped()
            else:
                logger.info("maintenance unit=%s %s", self.name, " ".join(f"{t}={s:.1f}s" for t, s in took.items()))

    def _skipped(self) -> None:
        """Another process holds the table maintenance duty: say so at INFO, once per SKIP_LOG_EVERY (with the
        holder and how many turns were skipped), so that a duty never taken is never silent."""
        self.skipped += 1
        now = time.monotonic()
        if now < self.next_skip_log:
            return
        self.next_skip_log = now + SKIP_LOG_EVERY
        try:
            leader = engine.leaders.leader_of(engine.leaders.TABLE_MAINTENANCE)
        except Exception:  # noqa: BLE001  only for the log line
            leader = None
        held = f"{leader[0]} until {leader[1]:%H:%M:%S}" if leader else "another process"
        logger.info(
            "maintenance unit=%s skipped %d time(s): the %s duty is held by %s (one VACUUM or ANALYZE of the hot "
            "tables at a time); next said in %.0f s at most",
            self.name,
            self.skipped,
            engine.leaders.TABLE_MAINTENANCE,
            held,
            SKIP_LOG_EVERY,
        )
        self.skipped = 0


class _Rows(_Background):
    """A unit that moves or deletes rows in bounded batches (archive, prune_done, history_retention), off the loop:
    a batch of 5,000 items moved into the history is ~100 ms of statement, and with a backlog of them (a drain of
    a million items, finished a minute ago) the loop waited that long every round, leases and hand-overs with it
    (archiver busy, 9,600 items/s: enqueue-to-start p99 37-50 ms in the loop, 24-30 ms off it). Each batch is
    its own transaction under the unit's advisory lock in the thread's connection (one worker at a time does
    each, as in the loop); batches follow each other while they come back full, for at most `turn` seconds (then
    the other units of the thread have their turn, and this one is due again at once: `again`); the connection
    is closed at the end of the turn. A failed batch is said in the log and tried next turn."""

    def __init__(
        self,
        name: str,
        batch: Callable[[], tuple[dict[str, int], bool]],
        shared: list[threading.Thread | None] | None = None,
        turn: float = 2.0,
    ):
        super().__init__(shared)
        self.name, self.batch, self.turn = name, batch, turn
        # Not the loop's lock of this unit: the loop holds that one until it commits, just after starting us.
        self.lock = f"{name}:rows"
        self.again: Callable[[], None] = lambda: None  # makes the unit due now (_rows_unit)
        self.soon: Callable[[], None] = lambda: None  # makes it due within SKIPPED_AGAIN (_rows_unit)

    def __call__(self) -> tuple[dict[str, int], bool]:
        if self.busy():  # another unit's turn: this one comes back soon, not a whole interval later
            self.soon()
        else:
            self._start(self._run)
        return {}, False

    def _run(self) -> None:
        totals: dict[str, int] = {}
        t0, more = time.monotonic(), False
        try:
            while True:
                with atomic():
                    if not engine.try_maintenance_lock(self.lock):
                        break
                    counts, more = self.batch()
                for key, value in counts.items():
                    totals[key] = totals.get(key, 0) + value
                if not more or time.monotonic() - t0 >= self.turn or self.closing.is_set():
                    break
        except Exception as exc:  # e.g. the server went away: say so, try next turn
            more = False
            logger.warning("maintenance unit=%s failed: %s", self.name, exc)
        finally:
            connection.close()  # this thread's own
        if more:
            self.again()
        _log_counts(self.name, totals)


def _rows_unit(name: str, every: float, batch: Callable[[], tuple[dict[str, int], bool]], shared: list) -> Unit:
    """A _Rows unit that is due again as soon as a turn ends with more to do (a backlog), and within SKIPPED_AGAIN
    seconds when its turn found the maintenance thread busy with another unit's (all are due as a worker starts:
    history_retention waited its whole 30 s behind prune_done's first turn)."""
    rows = _Rows(name, batch, shared)
    unit = Unit(name, every, rows)
    rows.again = lambda: setattr(unit, "due_at", 0.0)
    rows.soon = lambda: setattr(unit, "due_at", min(unit.due_at, time.monotonic() + SKIPPED_AGAIN))
    return unit


def _history_unit(shared: list) -> Unit:
    """The partitioned history's unit (engine.history_round), due every HISTORY_EVERY seconds, or every half of the
    shortest retention of the queues pruned row by row when that is less (HISTORY_EVERY_LEAST at least): a queue
    keeping a minute of history holds about 1.5 minutes of it, one keeping 2 s about 3 s (not 32). The interval is
    read again after each batch (one small query); a shorter one takes effect at once, a longer one from the next
    turn."""

    @functools.wraps(engine.history_round)  # the prune task's round too (inspect.unwrap finds it)
    def batch() -> tuple[dict[str, int], bool]:
        counts, more = engine.history_round()
        shortest = engine.shortest_row_retention()
        unit.every = HISTORY_EVERY if shortest is None else min(HISTORY_EVERY, max(HISTORY_EVERY_LEAST, shortest / 2))
        unit.due_at = min(unit.due_at, time.monotonic() + unit.every)
        return counts, more

    unit = _rows_unit("history_retention", HISTORY_EVERY, batch, shared)
    return unit


def _vacuum_unit(shared: list | None = None, holder: str | None = None) -> _InThread:
    """VACUUM the hot tables whose dead rows piled up (engine.bloated_tables). Several workers may start one;
    one at a time runs (engine.maintenance._each), and VACUUM (SKIP_LOCKED) skips a table autovacuum holds."""
    return _InThread("vacuum", engine.bloated_tables, functools.partial(engine.vacuum, holder=holder), shared)


def _analyze_unit(shared: list | None = None, holder: str | None = None) -> _InThread:
    """ANALYZE the hot tables that outgrew their statistics (engine.stale_statistics): the engine's generic plans
    made on an empty table read it whole until new statistics make every session plan again; and, once a
    minute at most, those whose rows have all changed since they were last analyzed."""
    return _InThread("analyze", engine.stale_statistics, functools.partial(engine.analyze, holder=holder), shared)


def _id_marks() -> tuple[dict[str, int], bool]:
    engine.take_mark(spacing=0.9 * queue_settings.ID_MARK_EVERY)
    return {}, False  # one mark every 10 s, one forgotten: nothing worth a log line


def _sweep_workers() -> tuple[dict[str, int], bool]:
    lost, forgotten = engine.sweep_workers(queue_settings.WORKER_LOST_AFTER, WORKER_FORGET_AFTER)
    return {"marked_stopped": lost, "deleted": forgotten}, False


def drop_events(stats: Stats | None = None) -> tuple[dict[str, int], bool]:
    """Drop what expired, as the layers say (hooks.expired_drops: the workflows app's events no wait claimed by the
    end of their lookback; logged: dropped=N), counted in the worker's stats (its Worker row, /metrics:
    jobsite_worker_events_dropped_total)."""
    dropped = sum(drop(EVENT_DROP_BATCH) for drop in hooks.expired_drops)
    if stats is not None:
        stats.events_dropped += dropped
    return {"dropped": dropped}, dropped >= EVENT_DROP_BATCH


def _fire_schedules() -> tuple[dict[str, int], bool]:
    # The advisory lock keeps schedulers from working in parallel; the unique fire row is the guarantee.
    fired = scheduling.tick(limit=SCHEDULE_BATCH)
    return {"fired": sum(not f.duplicate for f in fired), "dedup_skipped": sum(f.duplicate for f in fired)}, False


def default_units(*, scheduler: bool = True, stats: Stats | None = None, holder: str | None = None) -> list[Unit]:
    """The units; `holder` (the worker's id) holds the table maintenance duty while its VACUUM or ANALYZE runs,
    renewed by the worker's heartbeat."""
    # The maintenance thread: the units that move rows, VACUUM and ANALYZE take turns in it (one connection).
    background: list[threading.Thread | None] = [None]
    units = [
        Unit("rescue_expired", 1.0, _rescue),
        # The units that move or delete rows in bulk run in the maintenance thread, a turn at a time (_Rows);
        # the prunes' rounds are the prune task's too (engine/pruning.py).
        _rows_unit("prune_done", 60.0, engine.prune_round, background),
        # Every 2 s, and at once after a turn that left more: 5,000 items a batch in ~0.1 s, tens of thousands a s.
        _rows_unit("archive", 2.0, _archive, background),
        # Every 30 s, or half the shortest retention of a queue pruned row by row when that is less (_history_unit).
        _history_unit(background),
        # Often: a lease walks past every dead entry at the head of item_fetch until a VACUUM clears them (at
        # 10,000 items/s that is 300,000 more a minute); it only VACUUMs past bloated_tables' thresholds. Two
        # workers draining 300,000 no-ops: 10,800-17,700 items/s checking every 30 s, 19,000-20,300 every 5 s.
        Unit("vacuum", 5.0, _vacuum_unit(background, holder)),
        # Four times a second: a queue filled from empty runs on plans made for an empty table until this ANALYZE.
        # In the first 3 s of a fill at 7,000 items/s on 3 workers the slowest of 60 probes waited 93-300 ms with
        # a check every second (and 128 pages before an ANALYZE), 38-110 ms checking every 0.25 s (16 pages).
        Unit("analyze", 0.25, _analyze_unit(background, holder)),
        Unit("sweep_workers", 60.0, _sweep_workers),
        # Where the id sequences stand: the admin's time filters start their walk there (engine/marks.py).
        Unit("id_marks", queue_settings.ID_MARK_EVERY, _id_marks),
        # A batch of at most 1,000 small rows through a partial index: a short statement, in the loop.
        Unit("drop_events", 60.0, functools.partial(drop_events, stats)),
    ]
    if scheduler:
        units.append(Unit("scheduler", 1.0, _fire_schedules))
    return units


class Maintenance:
    def __init__(
        self,
        units: list[Unit] | None = None,
        *,
        scheduler: bool = True,
        stats: Stats | None = None,
        holder: str | None = None,
    ) -> None:
        self.units = default_units(scheduler=scheduler, stats=stats, holder=holder) if units is None else units

    def next_due(self) -> float:
        return min((u.due_at for u in self.units), default=float("inf"))

    def run_due(self) -> None:
        """Run the units that are due. A database error propagates (the unit stays due)."""
        for unit in self.units:
            now = time.monotonic()
            if now < unit.due_at:
                continue
            # Set before the run: a unit's thread may make it due sooner (_Rows.again) before run_due is back.
            unit.due_at = now + unit.every
            try:
                with atomic():
                    if not engine.try_maintenance_lock(unit.name):
                        continue
                    counts, more = unit.run()
            except BaseException:
                unit.due_at = now  # stays due
                raise
            if more:
                unit.due_at = now
            _log_counts(unit.name, counts)

    def close(self, timeout: float) -> bool:
        """Wait for the maintenance thread's turn in progress, which starts no new batch from now on: the worker
        says it stopped, and lets its duties go, once no thread of its own writes any more. An embedded worker
        (a burst run in a test, in an adopter's process) otherwise returned while its thread still archived or
        pruned, its transaction open beside the caller's next one. False when the thread outlived `timeout`
        seconds (a long VACUUM): the process's exit cuts its statement."""
        background = [unit.run for unit in self.units if isinstance(unit.run, _Background)]
        for run in background:
            run.closing.set()
        deadline = time.monotonic() + timeout
        for thread in {run.thread for run in background} - {None}:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(run.busy() for run in background)
