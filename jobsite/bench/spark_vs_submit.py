"""A script through jobsite against the same script under a bare `spark-submit`, behind `manage.py spark_bench
--vs-submit PAIRS`: how much a cold script run costs on top of Spark's own.

A PySpark word count (2,000 lines of text, the shape of apache/spark's examples/src/main/python/wordcount.py) runs
as `spark-submit --master local[*] wordcount.py input.txt` and as `manage.py spark_run --script wordcount.py --arg
input.txt --wait --json` (queued, leased by a worker this bench starts, launched, followed, recorded), in pairs
on the same machine one right after the other, the order alternating from pair to pair, each pair with the load
average it ran under. Each jobsite run also brings its own split (SparkRun.timings): queued, leased, child
launched, driver up, first task, last task, child ended, recorded; and the CLI's own start (process start ->
queued) and end (recorded -> the CLI's exit), which the run cannot see.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

WORDCOUNT = """import sys
from operator import add

from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("WordCount").getOrCreate()
lines = spark.read.text(sys.argv[1]).rdd.map(lambda row: row[0])
counts = lines.flatMap(lambda line: line.split(" ")).map(lambda word: (word, 1)).reduceByKey(add).collect()
for word, count in counts:
    print(f"{word}: {count}")
spark.stop()
"""
WORDS = ["alpha", "beta", "gamma", "delta", "queue", "spark", "lease", "worker", "item", "run", "settle", "reserve"]
MASTER = "local[*]"


def write_input(path: str, lines: int = 2000, seed: int = 1) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(WORDS) for _ in range(12)) + "\n")


def _manage() -> list[str]:
    return [sys.executable, os.path.join(str(settings.BASE_DIR), "manage.py")]


def _start_worker(env: dict[str, str], log) -> subprocess.Popen:
    """A worker serving the spark queue (one slot), ready when its row says it runs."""
    from queue_app.models import Worker

    proc = subprocess.Popen(
        [*_manage(), "run_worker", "--queues", "spark", "--concurrency", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not Worker.objects.filter(pid=proc.pid, state="running").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the bench's worker did not start (exit {proc.returncode}); see {log.name}")
        time.sleep(0.2)
    return proc


def _bare(script: str, text: str, env: dict[str, str]) -> float:
    from queue_app.spark.session import spark_home

    t0 = time.perf_counter()
    subprocess.run(
        [os.path.join(spark_home(), "bin", "spark-submit"), "--master", MASTER, script, text],
        env=env,
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - t0


def _jobsite(script: str, text: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    from queue_app.spark.models import SparkRun

    began = time.time()
    t0 = time.perf_counter()
    done = subprocess.run(
        [*_manage(), "spark_run", "--script", script, "--arg", text, "--wait", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    total = time.perf_counter() - t0
    ended = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"spark_run failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    run = SparkRun.objects.get(id=summary["id"])
    split = dict(summary["timings"])
    split["cli_start"] = round(run.queued_at.timestamp() - began, 2)  # the CLI's Python and Django, then trigger
    split["cli_end"] = round(ended - run.timings["recorded"], 2)  # its last look at the run, and its exit
    return total, split


def run(pairs: int, out: Callable[[str], None]) -> dict[str, Any]:
    """`pairs` pairs of (bare spark-submit, jobsite) runs of the word count, alternating which goes first."""
    from queue_app.spark.commandline import child_environment
    from queue_app.spark.scripts import ROOTS_ENV

    with tempfile.TemporaryDirectory(prefix="spark-vs-submit-") as root:
        script, text = os.path.join(root, "wordcount.py"), os.path.join(root, "input.txt")
        with open(script, "w") as f:
            f.write(WORDCOUNT)
        write_input(text)
        # The bare run gets what the launcher gives a run's processes (Spark from the installed pyspark, this
        # interpreter for the driver and its workers), nothing of jobsite's Spark conf.
        bare_env = child_environment({"SPARK_MASTER": MASTER})
        env = {**os.environ, ROOTS_ENV: root, "SPARK_MASTER": MASTER}
        with open(os.path.join(root, "worker.log"), "w") as log:
            out("starting a worker for the spark queue ...")
            worker = _start_worker(env, log)
            try:
                results = []
                for i in range(pairs):
                    load = round(os.getloadavg()[0], 2)
                    order = ("bare", "jobsite") if i % 2 == 0 else ("jobsite", "bare")
                    pair: dict[str, Any] = {"load": load, "first": order[0]}
                    for side in order:
                        if side == "bare":
                            pair["bare_s"] = round(_bare(script, text, bare_env), 2)
                        else:
                            jobsite_s, pair["split"] = _jobsite(script, text, env)
                            pair["jobsite_s"] = round(jobsite_s, 2)
                    pair["diff_s"] = round(pair["jobsite_s"] - pair["bare_s"], 2)
                    out(
                        f"pair {i + 1}/{pairs} (load {load}, {order[0]} first): bare {pair['bare_s']} s, "
                        f"jobsite {pair['jobsite_s']} s, difference {pair['diff_s']:+.2f} s"
                    )
                    results.append(pair)
            finally:
                worker.terminate()
                try:
                    worker.wait(60)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
    steps = [key for key in results[0]["split"]]
    return {
        "pairs": results,
        "bare_median_s": round(statistics.median(p["bare_s"] for p in results), 2),
        "jobsite_median_s": round(statistics.median(p["jobsite_s"] for p in results), 2),
        "diff_median_s": round(statistics.median(p["diff_s"] for p in results), 2),
        "split_median_s": {
            step: round(statistics.median(p["split"][step] for p in results if p["split"].get(step) is not None), 2)
            for step in steps
        },
        "load": [p["load"] for p in results],
    }
