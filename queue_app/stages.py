"""Where an item's start latency goes, stage by stage, for the bench (`queue_bench --only split` prints the split):
with JOBSITE["STAGE_TIMES"] set to a file path, the worker and its pool stamp each lease, each job handed to the
pool and each job a thread or child takes, in memory, and write them to that file when the worker (or a pool
child) ends. Wall-clock times (time.time(), CLOCK_REALTIME: the database server's clock on the same host, so they
line up with the item's created_at and the handler's first statement's clock_timestamp(), across processes).

Off by default: `on` is read once, at the worker's start (configure); every call site checks it before calling
anything here, so an off worker never calls a recording function (tests/core/processes/test_worker_stage_times.py). On,
a stamp is a time.time() and a list append; the file is written at the end, off the timed path (and, in a long run, each
time FLUSH_AT stamps have gathered: at the worker's heartbeat, or after a child's job).

Only the items of TASKS are stamped: the tasks whose handlers stamp their first line (the probes register theirs,
queue_app/probes/tasks.py), the only items a split is made of. A worker timed under a load of other items stamps
the few probes among them, not the load: stamping every item, at 15,700 items/s each worker gathered FLUSH_AT
stamps every few seconds and wrote them out in its loop, at its heartbeat (about 65 ms of Python a time), and the
probes that came meanwhile waited for it. The half-load p99 the bench measured was 20-30 ms higher for it (four
pairs alternated, 2026-12-06: 72, 58, 64 and 92 ms against 42, 48, 39 and 63 with no write during the run).

Lines, space-separated (a worker and its pool children append to the same file; each flush is one write):
- `L <reservation_id> <woken> <sent> <leased> <asked> <got> <path>`: the notification that woke the loop for the
  lease that took the item (0 when the lease was not a wake-up's: a poll, a freed slot, more work known to wait),
  the settle-and-lease statement sent and its result back, how many items it asked for and got, and where it ran
  (`loop`: in the loop of a worker with nothing in hand; `thread`: on the lease thread; `beside`: in the loop
  beside the lease thread's settle, supervisor._lease_beside; `handoff`: no statement, the enqueue leased it and
  its notification was drained at the three times given, asked 1, got 1: engine/handoff.py);
- `S <reservation_id> <submitted>`: the job handed to the pool (a thread pool's queue, a child's pipe);
- `P <reservation_id> <picked>`: a pool thread or child took the job (a thread's get, a child's recv returned);
- `F <reservation_id> <first_line>`: the handler's first line (the probe tasks stamp it: queue_app/probes).
"""

import os
import time
from collections.abc import Sequence
from typing import Any

from .conf import queue_settings

TASKS: set[str] = set()  # the names of the tasks whose items are stamped
FLUSH_AT = 50_000  # stamps kept in memory at most, about (a long run with the stamps on does not grow without end)

on = False
_path: str | None = None
_stamps: list[tuple] = []


def configure() -> None:
    """Read STAGE_TIMES once (run_worker's process, before its pool starts: the children inherit `on`)."""
    global on, _path, _stamps
    _path = queue_settings.STAGE_TIMES or None
    on = _path is not None
    _stamps = []


def forget() -> None:
    """Drop the stamps a forked pool child inherited from the worker (the worker writes those itself)."""
    global _stamps
    _stamps = []


def leased(leases: Sequence[Any], woken: float, sent: float, leased_at: float, asked: int, path: str) -> None:
    """A lease's stamp, for its items of TASKS; `got` in their lines counts all it leased."""
    reservation_ids = [lease.reservation_id for lease in leases if lease.task in TASKS]
    if reservation_ids:
        _stamps.append(("L", reservation_ids, woken, sent, leased_at, asked, len(leases), path))


def submitted(job: Any) -> None:
    """A job (anything with `reservation_id` and `task`) handed to the pool, if its task is one of TASKS."""
    if job.task in TASKS:
        _stamps.append(("S", job.reservation_id, time.time()))


def picked(job: Any) -> None:
    """A job taken by a pool thread or child, if its task is one of TASKS."""
    if job.task in TASKS:
        _stamps.append(("P", job.reservation_id, time.time()))


def first_line(reservation_id: int) -> None:
    _stamps.append(("F", reservation_id, time.time()))


def _lines(stamp: tuple) -> str:
    if stamp[0] != "L":
        return f"{stamp[0]} {stamp[1]} {stamp[2]:.6f}\n"
    _, ids, woken, sent, leased_at, asked, got, path = stamp
    return "".join(f"L {r} {woken:.6f} {sent:.6f} {leased_at:.6f} {asked} {got} {path}\n" for r in ids)


def flush(at_least: int = 1) -> None:
    """Append the stamps taken in this process to the file, and forget them: at a worker's or a child's end, or
    when `at_least` have gathered (FLUSH_AT, between two rounds of the loop or two jobs of a child)."""
    global _stamps
    if _path is None or len(_stamps) < at_least:
        return
    taken, _stamps = _stamps, []  # a pool thread stamping meanwhile appends to the new list
    text = "".join(_lines(stamp) for stamp in taken)
    fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
