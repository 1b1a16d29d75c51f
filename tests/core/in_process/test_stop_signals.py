"""The stop a signal asks for, waited for without a lock (queue_app/stop_signals.py): a handler that set a
threading.Event could hang its process for good when the signal came while the main thread held that Event's
lock (a benchmark feeder did). These check that the signal ends the wait whenever it comes: before the wait, or
while the main thread is blocked in it (forced: the signal is sent only once the kernel shows that thread in its
select)."""

import os
import signal
import threading
import time

import pytest

from queue_app.stop_signals import StopSignals, Wakeup
from tests.support.waiting import wait_for

SELECT_CALLS = {"x86_64": {"23", "270"}, "aarch64": {"72"}}  # select, pselect6: /proc/<tid>/syscall's first field


def _in_select(tid: int) -> bool:
    with open(f"/proc/self/task/{tid}/syscall") as f:
        return f.read().split()[0] in SELECT_CALLS[os.uname().machine]


def _signal_once_waiting(signum: int) -> threading.Thread:
    """A thread that sends `signum` to this process once the main thread is blocked in select()."""
    main = threading.get_native_id()

    def send() -> None:
        wait_for(lambda: _in_select(main), 30, what="the main thread to block in its wait", interval=0.005)
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


@pytest.mark.skipif(os.uname().machine not in SELECT_CALLS, reason="syscall numbers known for x86_64 and aarch64")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_that_comes_during_the_wait_ends_it(signum):
    before = signal.getsignal(signum)
    with StopSignals() as stop:
        sender = _signal_once_waiting(signum)
        t0 = time.monotonic()
        assert stop.wait(60) is True
        assert time.monotonic() - t0 < 30 and stop.signum == signum
        sender.join(5)
    assert signal.getsignal(signum) is before  # the handler it replaced is back


def test_a_stop_signal_that_came_before_the_wait_ends_it_at_once_and_none_times_out():
    with StopSignals() as stop:
        assert stop.wait(0.05) is False and not stop.stopped  # no signal: the wait runs out
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, before the wait
        t0 = time.monotonic()
        assert stop.wait(60) is True and time.monotonic() - t0 < 1


@pytest.mark.skipif(os.uname().machine not in SELECT_CALLS, reason="syscall numbers known for x86_64 and aarch64")
def test_a_wakeup_given_from_a_signal_handler_ends_the_wait_and_is_taken_by_it():
    wakeup = Wakeup()
    previous = signal.signal(signal.SIGUSR1, lambda *_: wakeup.set())
    try:
        _signal_once_waiting(signal.SIGUSR1)
        assert wakeup.wait(60) is True
        assert wakeup.wait(0.05) is False  # taken: the next wait runs out
        wakeup.set()
        wakeup.set()
        assert wakeup.wait(0) is True and wakeup.wait(0) is False  # two given before the wait: one wake
    finally:
        signal.signal(signal.SIGUSR1, previous)
        wakeup.close()
