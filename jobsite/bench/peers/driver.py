"""Enqueue-to-start for a peer, measured the same way for every one (`Peer.measure_latency`):

- its workers (the variant that won its throughput, kept running) run its own no-op jobs and a `probe(n)` job
  whose handler first appends `n <time.time()>` to the file named by JOBSITE_BENCH_PROBE_FILE
  (probe.record_start);
- a feeder process (`python -m jobsite.bench.peers.driver feed NAME PER_S`) queues no-ops with the peer's own
  API at a steady rate, in small batches every 20 ms, as jobsite's feeder does (bench/feeder.py);
- a prober process (`... probe NAME SAMPLES FILE`) queues one probe at a time, the clock read just before the
  enqueue call, waits until its start is in the file, and prints the milliseconds between as one JSON line.

Both are processes of their own (the GIL would otherwise put the feeder's work into the probe's latency) and use
the wall clock of this one machine. jobsite's figure beside it comes from its own probe (bench/jobsite_side.py),
read the same way: from the clock read just before the enqueue call to the handler's first line (the workers'
stage times).
"""

import json
import signal
import sys
import time
from pathlib import Path

from queue_app.stop_signals import StopSignals

from . import Client, load

FEED_EVERY = 0.02  # seconds between the feeder's batches
WARM_UP_TIMEOUT = 120.0  # seconds the first probe may wait for the workers to come up (not counted)
WARM_UP_RETRY = 5.0  # seconds between the warm-up probes sent
PROBE_TIMEOUT = 30.0  # seconds one counted probe may wait
POLL_EVERY = 0.002  # seconds between looks at the file (a stat and a short read)
GAP = 0.02  # seconds between two probes


class _Starts:
    """The probe starts recorded so far, read from the file as it grows."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.seen = path, 0, {}

    def wait(self, n: int, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while n not in self.seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"probe {n} did not start within {timeout:.0f} s")
            time.sleep(POLL_EVERY)
            self._read()
        return self.seen[n]

    def _read(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in complete.splitlines():
            n, at = line.split()
            self.seen[int(n)] = float(at)


def _client(name: str) -> Client:
    return load(name).open_client()


def feed(name: str, per_s: float) -> int:
    """Queue `per_s` no-ops a second with the peer's API until SIGTERM; then print how many as JSON."""
    client = _client(name)
    fed, t0 = 0, time.monotonic()
    with StopSignals((signal.SIGTERM,)) as stop:  # not an Event: its set() in the handler could hang (stop_signals)
        print(json.dumps({"started": True}), flush=True)
        while not stop.wait(FEED_EVERY):
            due = int((time.monotonic() - t0) * per_s) - fed
            if due > 0:
                client.noops(due)
                fed += due
    client.close()
    print(json.dumps({"fed": fed}), flush=True)
    return 0


def probe(name: str, samples: int, path: Path) -> int:
    """One warm-up probe (the workers are up), then "warm" and wait for "go" on stdin (the feeder runs by then),
    then `samples` probes; prints {"ms": [...]}."""
    client, starts = _client(name), _Starts(path)
    deadline = time.monotonic() + WARM_UP_TIMEOUT
    while True:  # sent again until one runs: a broker may drop what it gets before any consumer is bound (Redis)
        client.probe(0)
        try:
            starts.wait(0, WARM_UP_RETRY)
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
    print(json.dumps({"warm": True}), flush=True)
    sys.stdin.readline()
    ms = []
    for n in range(1, samples + 1):
        t0 = time.time()
        client.probe(n)
        ms.append((starts.wait(n, PROBE_TIMEOUT) - t0) * 1000)
        time.sleep(GAP)
    client.close()
    print(json.dumps({"ms": ms}), flush=True)
    return 0


if __name__ == "__main__":
    mode, peer_name, *rest = sys.argv[1:]
    if mode == "feed":
        sys.exit(feed(peer_name, float(rest[0])))
    sys.exit(probe(peer_name, int(rest[0]), Path(rest[1])))
