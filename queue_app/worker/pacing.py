"""How much work a worker holds in hand: its slots, and of its prefetch as much as --hold seconds of work at the
pace its pool keeps (the whole prefetch while it works through a backlog). The supervisor (worker/supervisor.py)
reports what finished and when a lease found fewer items ready than it asked for; this says how many items it may
hold, running plus leased and not started.

Under a steady load the first worker woken would otherwise lease each burst whole and work through it alone while
the others idle: its last items waited 50-60 ms in hand (p99) at 11,000 items/s with --prefetch 500 on two
workers; 26-38 ms held to 25 ms of work, the same end-to-end throughput."""

import time

PACE_EVERY = 0.25  # seconds between updates of the pace a worker's pool keeps (items finished per second)
# A worker whose leases have found all they asked for during this long is working through a backlog: every worker
# has plenty, so it holds its whole prefetch (leases of the largest batches). Counted from the last lease that found
# fewer items ready than it asked for, not from a slot with nothing to start: draining a backlog of short jobs,
# slots empty between two lease round trips all the time, and the worker held back to a fraction of its batch
# (82 items a lease of 250 asked for: 8,600-10,800 no-ops/s on 4 x 16 threads, 12,200-15,500 at whole batches).
BACKLOG_AFTER = 1.0


class Pacing:
    def __init__(self, concurrency: int, prefetch: int | None, hold: float) -> None:
        self.concurrency = concurrency
        # Running plus leased-not-started items at most: a short handler finds its next item in hand, not a round
        # trip away. Held items' leases are renewed like running ones, so waiting in hand never lets one lapse.
        self.capacity = concurrency + (concurrency if prefetch is None else prefetch)
        self.hold = hold
        self.pace = 0.0  # items finished per second lately (0: none measured yet)
        self.count, self.since = 0, time.monotonic()
        self.ran_dry_at = time.monotonic()  # when a lease last found fewer items ready than it asked for

    @property
    def prefetch(self) -> int:
        return self.capacity - self.concurrency

    def finished(self, now: float, count: int) -> None:
        """`count` items finished since the last call."""
        self.count += count
        if now - self.since >= PACE_EVERY:
            recent = self.count / (now - self.since)
            self.pace = (self.pace + recent) / 2 if self.pace else recent
            self.count, self.since = 0, now

    def ran_dry(self, now: float) -> None:
        """A lease found fewer items ready than it asked for: no backlog."""
        self.ran_dry_at = now

    def held_most(self) -> int:
        """Running plus held items at most: the slots, and of the prefetch, --hold seconds of work at the pace
        the pool keeps, never less than --concurrency (the default prefetch: unchanged) so the pace can grow;
        the whole prefetch while it works through a backlog (BACKLOG_AFTER)."""
        if not self.hold or time.monotonic() - self.ran_dry_at > BACKLOG_AFTER:
            return self.capacity
        return self.concurrency + min(self.prefetch, max(self.concurrency, int(self.pace * self.hold)))
