"""`python -m jobsite.bench.enqueue_probe ROWS CHUNK QUEUE`: one bulk-enqueue caller in a process of its own (as
a web worker or a batch job would be), run by jobsite_side.py with the environment pointing at the bench's scratch
database. It warms its connection, prints "ready", waits for a line on stdin, queues ROWS no-op items through
`engine.enqueue_many` in calls of CHUNK rows, and prints {"rows", "seconds"} as one JSON line.

Several run at once to measure concurrent callers: as processes, not threads, so the callers' Python work is not
serialised by one interpreter lock (the ceiling's pgbench clients are separate connections too).
"""

import json
import sys
import time

NOOP_TASK = "queue_app.noop"


def main(rows: int, chunk: int, queue: str) -> dict:
    import django

    django.setup()
    from queue_app import engine

    payloads = [{} for _ in range(chunk)]
    engine.enqueue_many(NOOP_TASK, payloads[:100], queue=queue)  # connection open, statements prepared
    print("ready", flush=True)
    sys.stdin.readline()
    written = 0
    t0 = time.perf_counter()
    while written < rows:
        written += len(engine.enqueue_many(NOOP_TASK, payloads[: min(chunk, rows - written)], queue=queue))
    return {"rows": written, "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])), flush=True)
