"""The worker's options and the small records its loop keeps: what an operator asks for (WorkerOptions), an item
handed to the pool (Running), a settle waiting for the database (Pending), and what counts as the database
being down."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import psycopg
from django.db.utils import InterfaceError, OperationalError

from ..engine import Lease
from ..registry import Task

DATABASE_DOWN = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# How often the hard timeouts of items still waiting in the pool's queue are looked at again (their clock starts
# when a thread takes them): the precision of a hard timeout in the thread pool.
DEADLINE_RECHECK = 0.25


@dataclass(frozen=True)
class WorkerOptions:
    queues: list[str] | None = None  # None: every queue
    concurrency: int = 4
    pool: str = "process"
    batch: int | None = None  # most items per lease; None: as many as there is room for
    prefetch: int | None = None  # items held leased, not yet started, beyond the slots; None: concurrency
    # ...and of those beyond --concurrency, at most this many seconds of work at the pace the pool keeps (0: hold
    # the whole prefetch whatever the pace). See worker/pacing.py.
    hold: float = 0.025
    poll_interval: float = 1.0
    worker_id: str | None = None
    burst: bool = False
    max_items: int | None = None
    grace_period: float = 25.0
    scheduler: bool = True  # fire due cron schedules (the "scheduler" maintenance unit)

    def problems(self) -> list[str]:
        found = []
        if self.concurrency < 1:
            found.append(f"--concurrency must be at least 1, not {self.concurrency}")
        if self.batch is not None and self.batch < 1:
            found.append(f"--batch must be at least 1, not {self.batch}")
        if self.prefetch is not None and self.prefetch < 0:
            found.append(f"--prefetch must be at least 0, not {self.prefetch}")
        if not (self.hold >= 0 and self.hold != float("inf")):
            found.append(f"--hold must be a number of seconds >= 0, not {self.hold}")
        if not self.poll_interval > 0:
            found.append(f"--poll-interval must be > 0 seconds, not {self.poll_interval}")
        if self.max_items is not None and self.max_items < 1:
            found.append(f"--max-items must be at least 1, not {self.max_items}")
        if self.grace_period < 0:
            found.append(f"--grace-period must be >= 0 seconds, not {self.grace_period}")
        if self.pool not in ("process", "thread"):
            found.append(f"--pool must be 'process' or 'thread', not {self.pool!r}")
        return found


class Running(NamedTuple):
    """An item handed to the pool: running, or (thread pool) waiting in its queue for a thread. A named tuple:
    the supervisor makes one per item."""

    lease: Lease
    task: Task
    # A chunk (Task.chunk): every item of the handler call, `lease` (the pool's key) the first of them.
    members: tuple[Lease, ...] = ()

    @property
    def leases(self) -> tuple[Lease, ...]:
        return self.members or (self.lease,)


@dataclass
class Pending:
    """A settle (other than a plain complete) waiting for the database; `apply` returns the item's fate."""

    lease: Lease
    what: str
    apply: Callable[[], str]
    retry_in: float | None = None  # a retry: due again this many seconds after the settle
