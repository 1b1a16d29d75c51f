"""A script run by spark-submit that starts no Spark session: gate.py <gate dir> <output dir>. It says it started
(`started` in the gate directory), waits until the test opens the gate (`open` there), then writes one small file
to its output directory. What happens to its run meanwhile is the test's: its lease lost, cancelled, timed out."""

import os
import sys
import time

if __name__ == "__main__":
    gate, out = sys.argv[1], sys.argv[2]
    open(os.path.join(gate, "started"), "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(gate, "open")):
        if time.monotonic() > deadline:
            sys.exit("the gate never opened")
        time.sleep(0.05)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "part-0.txt"), "w") as written:
        written.write("a\n")
