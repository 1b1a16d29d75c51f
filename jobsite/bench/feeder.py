"""`python -m jobsite.bench.feeder QUEUE PER_S`: the steady background load of the latency measure, in a process
of its own (as the web processes that enqueue would be): `PER_S` no-op items a second, queued in small batches
every 20 ms, until SIGTERM; then it prints how many it queued as one JSON line. Run by jobsite_side.py with the
environment pointing at the bench's scratch database.

A thread of the bench's own process would share the GIL with the probe's enqueues: a probe's insert and its
commit, each a round trip, then wait for a 200-row batch's Python work to let go (up to the 5 ms switch
interval), and that wait counts as the worker's latency."""

import json
import signal
import sys
import time

NOOP_TASK = "queue_app.noop"
EVERY = 0.02  # seconds between batches


def main(queue: str, per_s: float) -> int:
    import django

    django.setup()
    from queue_app import engine
    from queue_app.stop_signals import StopSignals

    fed, t0 = 0, time.monotonic()
    with StopSignals((signal.SIGTERM,)) as stop:  # not an Event: its set() in the handler could hang (stop_signals)
        print(json.dumps({"started": True}), flush=True)
        while not stop.wait(EVERY):
            due = int((time.monotonic() - t0) * per_s) - fed
            if due > 0:
                fed += len(engine.enqueue_many(NOOP_TASK, [{}] * due, queue=queue))
    print(json.dumps({"fed": fed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
