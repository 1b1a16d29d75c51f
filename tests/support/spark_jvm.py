"""How the suite's Spark driver JVMs start (a pytest plugin installed by tests/conftest.py): at the first test marked
`spark`, `SPARK_SUBMIT_OPTS` gives every driver this process and its children start the test sizes and a quick
start's flags, and, once it is made, one class-data-sharing archive of Spark's classes.

The test sizes (RUN_SIZES: two shuffle partitions instead of 200, so a small rollup is a few tasks, not a
thousand) and the flags (C1 only, the serial GC) go as the driver's `-D`/`-XX` options: a job's or a run's own
conf (`--conf`) still wins over them. SPARK_SUBMIT_OPTS reaches the driver's JVM only: not spark-submit's
launcher JVM, whose class path differs, nor a standalone cluster's daemons.

A cold Spark driver spends most of its start loading and verifying some ten thousand classes from pyspark's jars.
A dynamic CDS archive (JDK 13+: `-XX:ArchiveClassesAtExit` once, `-XX:SharedArchiveFile` after) holds them
parsed and verified, and every JVM that names it maps them instead: about a third less CPU per spark-submit driver
on the 2-core VM (user 17.7 -> 11.5 s for a local session and one small job, two pairs alternated, load 4-6).
Nothing of what a test proves changes: each run still starts its own `spark-submit` JVM, cold, from the same jars.

The archive for this Java runtime, pyspark's jars and the flags is found or, in a thread beside the first Spark
tests, made (one spark-submit run of `tests/tasks/spark_scripts/class_archive_warmup.py`: 55 s of CPU at the
suite's load), kept in `~/.cache/jobsite/spark-cds/` (or `JOBSITE_TEST_SPARK_CDS_DIR`) while its key matches, and
named in SPARK_SUBMIT_OPTS from the next Spark test on. `JOBSITE_TEST_SPARK_CDS=0` turns it off; an archive that
cannot be made is reported once and the tests run without it.

The archive's class path must be the driver's: pyspark's jars and no non-empty directory (the JDK refuses to
archive with one, and ignores an archive whose path differs). So the tests give Spark its test conf in
SPARK_SUBMIT_OPTS (`spark_conf_opts`), never in a SPARK_CONF_DIR, which spark-submit puts first on the class path.
Proof that the drivers use it: tests/spark/spark/test_spark_jvm.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

PLUGIN = "jobsite_spark_jvm"
# The JVM flags of the suite's drivers (C1 only, the serial GC: a quick start); the archive is made with them.
FAST_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
STALE_AFTER = 7 * 86400  # an archive no run has used for a week is deleted when another is made or used
RUN_SIZES = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
# JVM log lines go to stderr, errors only: the JDK's notes about an archive (a class it skipped, a path that
# differs) would otherwise go to the driver's stdout.
QUIET_CDS = "-Xlog:disable -Xlog:all=error:stderr"
WARMUP = Path(__file__).resolve().parent.parent / "tasks" / "spark_scripts" / "class_archive_warmup.py"

_state: dict[str, object] = {}


def enabled() -> bool:
    return os.environ.get("JOBSITE_TEST_SPARK_CDS", "1").lower() not in ("0", "false", "no", "off")


def archive_dir() -> Path:
    return Path(os.environ.get("JOBSITE_TEST_SPARK_CDS_DIR") or Path.home() / ".cache" / "jobsite" / "spark-cds")


def _key(spark_home: Path, java: str) -> str:
    """What the archive depends on: the Java runtime (its modules file), pyspark's jars where they are (the JDK
    checks each jar's path, size and time, and ignores an archive made of other files), the flags, the warm-up."""
    runtime = Path(os.path.realpath(java)).parent.parent / "lib" / "modules"
    stat = runtime.stat() if runtime.exists() else None
    jars = sorted(
        (entry.name, entry.stat().st_size, int(entry.stat().st_mtime)) for entry in os.scandir(spark_home / "jars")
    )
    parts = [
        str(runtime),
        stat and (stat.st_size, int(stat.st_mtime)),
        str(spark_home),
        jars,
        FAST_JVM_FLAGS,
        WARMUP.read_text(),
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _make(target: Path, spark_home: Path) -> str | None:
    """Dump the archive to `target` (None) or say why not."""
    with tempfile.TemporaryDirectory(prefix="spark-cds-") as work:
        partial = Path(work) / "classes.jsa"
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS")}
        env.update(
            PYSPARK_PYTHON=sys.executable,
            JAVA_TOOL_OPTIONS=FAST_JVM_FLAGS,
            SPARK_SUBMIT_OPTS=f"-XX:ArchiveClassesAtExit={partial} {QUIET_CDS}",
        )
        cmd = [str(spark_home / "bin" / "spark-submit"), "--master", "local[2]", str(WARMUP), work]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return "the warm-up run did not end in 900 s"
        if proc.returncode != 0 or not partial.exists():
            said = [line for line in proc.stderr.splitlines() if " INFO " not in line]  # Spark's own chatter
            return f"the warm-up run exited {proc.returncode}: " + "\n".join(said[-30:])
        shutil.move(partial, target)  # /tmp and the cache may be different file systems
    return None


def target() -> Path | None:
    """Where the archive for this Java runtime, pyspark and flags is (made or not); None without Java."""
    from queue_app.spark.java import java_executable
    from queue_app.spark.session import spark_home

    java = java_executable()
    if java is None:
        return None
    return archive_dir() / f"spark-{_key(Path(spark_home()), java)}.jsa"


def ensure(path: Path) -> Path | None:
    """The archive at `path`, made now if missing (one process at a time: the file lock); None when it cannot be
    made (said on stderr)."""
    from queue_app.spark.session import spark_home

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            staged = path.parent / f".{path.name}.{os.getpid()}"
            why = _make(staged, Path(spark_home()))
            if why is not None:
                print(f"\njobsite tests: no Spark class archive ({why}); Spark JVMs start without one", file=sys.stderr)
                return None
            os.replace(staged, path)
        os.utime(path)  # in use: kept by the pruning below
        for other in path.parent.glob("spark-*.jsa"):  # archives of other checkouts or versions, 168 MB each
            if other != path and time.time() - other.stat().st_mtime > STALE_AFTER:
                other.unlink(missing_ok=True)
    return path


def current(wait: bool = False) -> Path | None:
    """The archive this process's Spark JVMs name from now on: None before the first Spark test, while it is still
    being made (unless `wait`), or when there is none."""
    maker = _state.get("maker")
    if wait and isinstance(maker, threading.Thread):
        maker.join()
    _take_up()
    return _state.get("archive")  # type: ignore[return-value]


def submit_opts(archive: Path) -> str:
    return f"-XX:SharedArchiveFile={archive} {QUIET_CDS}"


def spark_conf_opts(conf: dict[str, str]) -> str:
    """Spark conf as the driver's `spark.*` system properties (for SPARK_SUBMIT_OPTS; no value may hold a space)."""
    for key, value in conf.items():
        if " " in value or " " in key:
            raise ValueError(f"{key}={value!r}: a system property in SPARK_SUBMIT_OPTS cannot hold a space")
    return " ".join(f"-D{key}={value}" for key, value in conf.items())


def _add_opts(opts: str) -> None:
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(part for part in (os.environ.get("SPARK_SUBMIT_OPTS"), opts) if part)


def _take_up() -> None:
    """Name the archive in SPARK_SUBMIT_OPTS once it is made: here, in the main thread (a child started meanwhile
    reads the environment), never from the thread that made it."""
    made = _state.get("made")
    if made is None or "archive" in _state:
        return
    _state["archive"] = made[0]
    if made[0] is not None:
        _add_opts(submit_opts(made[0]))


def _start() -> None:
    _state["maker"] = None
    _add_opts(f"{FAST_JVM_FLAGS} {spark_conf_opts(RUN_SIZES)}")
    if not enabled() or shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _state["made"] = (None,)
        return
    try:
        import pyspark  # noqa: F401
    except ImportError:
        _state["made"] = (None,)
        return
    path = target()
    if path is None or path.exists():
        _state["made"] = (path and ensure(path),)  # found: marked in use, at once
        return
    # Made beside the first Spark tests (they start their JVMs without it), not before them: on a fresh machine
    # the warm-up run takes a minute or two of a core at the suite's load.
    maker = threading.Thread(
        target=lambda: _state.__setitem__("made", (ensure(path),)), name="spark-archive", daemon=True
    )
    _state["maker"] = maker
    maker.start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before each Spark test's fixtures start a JVM: the options and the archive's making at the first, the
    archive named once made."""
    if item.get_closest_marker("spark") is None:
        return
    if "maker" not in _state:
        _start()
    _take_up()
