"""Where an item's start latency goes, stage by stage, for the bench (`queue_bench` prints the split): with
JOBSITE["STAGE_TIMES"] set to a file path, the worker appends one line per item it starts and per job its pool
picks up, wall-clock times (time.time(): the database server's clock on the same host, so they line up with the
item's created_at and the handler's first statement). Unset (the default): nothing is timed or written; what
remains on the hot path is one check of a module attribute per batch and per job.

Lines, space-separated (a worker and its pool children append to the same file; each line is one write):
- `L <reservation_id> <woken> <sent> <leased> <submitted>`: the notification that woke the loop for the lease
  that took the item (0 when the lease was not a wake-up's: a poll, a freed slot, more work known to wait), the
  settle-and-lease statement sent and its result back, the hand-over of its batch to the pool begun (a child
  woken by its job may take the core from the loop before the loop has handed over the rest);
- `P <reservation_id> <picked>`: a pool thread or child took the job and is about to run it.
"""

import os
import time

from ..conf import queue_settings

_fd: int | None = None
on = False


def configure() -> None:
    """Open the file named by STAGE_TIMES (run_worker's process, before its pool starts: the children inherit it)."""
    global _fd, on
    path = queue_settings.STAGE_TIMES
    if not path:
        return
    _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    on = True


def _write(line: str) -> None:
    if _fd is not None:
        os.write(_fd, line.encode())


def leased(reservation_ids: list[int], woken: float, sent: float, leased_at: float, submitted: float) -> None:
    _write("".join(f"L {r} {woken:.6f} {sent:.6f} {leased_at:.6f} {submitted:.6f}\n" for r in reservation_ids))


def picked(reservation_id: int) -> None:
    _write(f"P {reservation_id} {time.time():.6f}\n")
