"""What a worker tells its operator: on a terminal, one live status line (processed/s, in flight, failures);
otherwise structured `key=value` log lines on the "jobsite.worker" logger every few seconds while it works."""

import collections
import logging
import sys
import time
from dataclasses import asdict, dataclass
from typing import TextIO

from ..engine import tracing

logger = logging.getLogger("jobsite.worker")

LINE_EVERY = 0.5  # seconds between refreshes of the terminal status line
LOG_EVERY = 10.0  # seconds between status log lines while something changes
IDLE_LOG_EVERY = 300.0  # ...and while nothing does


@dataclass
class Stats:
    """Counters of one worker run, saved in its Worker row."""

    processed: int = 0  # items done
    failed: int = 0  # failed attempts (retried or dead), timeouts included
    timed_out: int = 0
    dead: int = 0  # items this worker sent to the dead letters (poison, last attempt, at-most-once failures)
    stale: int = 0  # attempts whose reservation was lost or cancelled under them
    events_dropped: int = 0  # workflow events no wait claimed, dropped past their lookback (the drop_events unit)
    handed_off: int = 0  # items started from a hand-off: leased by their own enqueue (engine/handoff.py)

    def as_dict(self) -> dict[str, int]:
        values = asdict(self)
        if tracing.enabled:  # spans this process dropped (collector down or slow): /metrics shows them
            values["spans_dropped"] = tracing.dropped()
        return values


def fields(**values: object) -> str:
    return " ".join(f"{key}={value}" for key, value in values.items())


class StatusReporter(logging.Filter):
    """Also a filter on the worker's logger: on a terminal, a log line first wipes the status line (the next
    tick draws it again), so the two never run into each other."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.line_shown = False
        if self.tty:
            logger.addFilter(self)
        self.samples: collections.deque[tuple[float, int]] = collections.deque()
        self.next_at = 0.0
        self.last_logged: tuple | None = None
        self.last_log_at = 0.0

    def rate(self, now: float, processed: int) -> float:
        """Items per second over the last five seconds."""
        self.samples.append((now, processed))
        while len(self.samples) > 2 and now - self.samples[0][0] > 5.0:
            self.samples.popleft()
        then, before = self.samples[0]
        return (processed - before) / (now - then) if now > then else 0.0

    def next_due(self) -> float:
        return self.next_at

    def tick(self, stats: Stats, *, in_flight: int, state: str, db_ok: bool) -> None:
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + (LINE_EVERY if self.tty else 1.0)
        rate = self.rate(now, stats.processed)
        values = {
            "state": state,
            "processed": stats.processed,
            "rate": f"{rate:.1f}/s",
            "in_flight": in_flight,
            "failed": stats.failed,
            "timed_out": stats.timed_out,
            "dead": stats.dead,
            "stale": stats.stale,
            "db": "ok" if db_ok else "down",
        }
        if self.tty:
            self.stream.write("\r\x1b[K" + fields(**values))
            self.stream.flush()
            self.line_shown = True
            return
        snapshot = (stats.processed, stats.failed, stats.dead, stats.stale, in_flight, state, db_ok)
        quiet = snapshot == self.last_logged
        if now - self.last_log_at >= (IDLE_LOG_EVERY if quiet else LOG_EVERY):
            logger.info("status %s", fields(**values))
            self.last_logged, self.last_log_at = snapshot, now

    def filter(self, record: logging.LogRecord) -> bool:
        if self.line_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.line_shown = False
        return True

    def close(self) -> None:
        if self.tty:
            logger.removeFilter(self)
            if self.line_shown:
                self.stream.write("\n")
                self.stream.flush()
