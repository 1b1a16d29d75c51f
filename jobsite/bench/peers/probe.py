"""The start of a peer's probe job, written by its handler in the peer's worker (`record_start`), for the
side-by-side latency (driver.py runs the feeder and the prober; `Peer.measure_latency` ties them together)."""

import os
import time

PROBE_FILE_ENV = "JOBSITE_BENCH_PROBE_FILE"


def record_start(n: int) -> None:
    """Called first thing by a peer's probe handler, in its worker: appends `n <time.time()>` to the file named by
    JOBSITE_BENCH_PROBE_FILE."""
    now = time.time()
    path = os.environ.get(PROBE_FILE_ENV)
    if path:
        with open(path, "a") as out:  # one short line, O_APPEND: workers' lines do not interleave
            out.write(f"{int(n)} {now!r}\n")
