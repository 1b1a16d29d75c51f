"""A stop asked by SIGTERM or SIGINT, and a wake-up a signal handler may give, waited for without a lock.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is, and that includes
the inside of a `threading.Event`'s wait or set, holding the Event's lock (`Condition._is_owned`). A handler that
then calls that Event's `set()` asks for the same lock, and the process hangs for good. A benchmark feeder
terminated while it waited on its Event did (py-spy: `Event.set` under `Event.wait`, 2026-12-05), and so could a
worker stopped while it waited for the database to come up, or a Spark child cancelled while it stopped its
progress thread. Here a handler only sets a flag and writes a byte to a pipe (`Wakeup.set`); the wait is a
`select()` on the pipe, which that byte ends whenever it came, before the wait or during it."""

from __future__ import annotations

import contextlib
import os
import select
import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Wakeup:
    """An Event without a lock, for waking one waiting thread from a signal handler: `set()` (any thread, a signal
    handler too) ends the `wait()` in progress or the next one; `wait()` takes the wake-ups given so far.
    `close()` when done with it."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        with contextlib.suppress(OSError):  # the pipe is full (a wake-up is there already), or closed
            os.write(self._write, b"!")

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for a wake-up; True if one came (all taken)."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, seconds))
        woken = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                woken = True
        return woken or bool(ready)

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class StopSignals:
    """``with StopSignals() as stop:`` installs the handlers (main thread only), restored on leaving;
    ``stop.wait(seconds)`` returns True as soon as one of the signals came, False after `seconds` without one."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None  # the signal that asked for the stop
        self._previous: dict[int, object] = {}
        self._wakeup: Wakeup | None = None

    @property
    def stopped(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopSignals:
        self._wakeup = Wakeup()
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._wakeup.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._wakeup.set()

    def wait(self, seconds: float) -> bool:
        if not self.stopped:
            self._wakeup.wait(seconds)
        return self.stopped
