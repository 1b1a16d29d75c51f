"""The suite's Spark driver options (tests/support/spark_jvm.py) reach the drivers they are meant for: a launched
run maps Spark's classes from the class archive and takes the test sizes."""

import os
import re
from pathlib import Path

import pytest

from queue_app.spark import eventlog
from queue_app.spark.launcher import launch
from tests.support import spark_jvm
from tests.support.spark_fixtures import FAST_JVM, require_spark

pytestmark = pytest.mark.spark


def test_a_launched_runs_driver_maps_sparks_classes_from_the_archive_and_takes_the_test_sizes(tmp_path, monkeypatch):
    require_spark()
    archive = spark_jvm.current(wait=True)
    assert archive is not None and archive.exists(), "no class archive was made: the run's stderr says why"
    loads = tmp_path / "class-load.log"
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", f"{os.environ['SPARK_SUBMIT_OPTS']} -Xlog:class+load=info:file={loads}")

    result = launch("demo_sleep", {"tasks": "1", "seconds": "0"}, run_id="class-archive", conf=FAST_JVM)

    assert result.outcome == "succeeded", result.log_tail
    text = loads.read_text()
    assert re.search(r"org\.apache\.spark\.SparkContext source: shared objects file \(top\)", text), text[-2000:]
    shared = text.count("source: shared objects file (top)")
    assert shared > 5000, f"only {shared} classes came from the archive"  # Spark's own, not just the JDK's
    properties = "".join(p.read_text() for p in Path(eventlog.run_dir("class-archive")).rglob("*") if p.is_file())
    assert '"spark.sql.shuffle.partitions":"2"' in properties  # the test sizes, as system properties
