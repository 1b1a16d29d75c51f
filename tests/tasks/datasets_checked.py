"""A dataset with a blocking check and a warn check, and a Spark script that consumes it: declared by the tests
that need them (declare(), declare_consumer()) and by the workers that run their items (`run_worker --import
tests.tasks.datasets_checked_worker`). Paths are under the root the test passes in JOBSITE_DATASET_ROOTS; the script is
tests/tasks/spark_scripts/pi.py (JOBSITE_SPARK_SCRIPT_ROOTS holds that directory)."""

import os

from queue_app.datasets import dataset
from queue_app.datasets.quality import CheckResult, check
from queue_app.spark.scripts import register_script
from tests.support.paths import SPARK_SCRIPTS

DATASET = "dsc_daily"
CONSUMER = "dsc_consumer"


def declare() -> None:
    dataset(DATASET, location="dsc/day={partition}", partitioning="daily", owner="tests")

    @check(DATASET, severity="error")
    def no_bad_marker(part):
        """Fails (blocking) on a day whose directory holds a file named BAD."""
        bad = [f for f in part.files() if os.path.basename(f) == "BAD"]
        return CheckResult(not bad, {"files": len(part.files())}, "a BAD marker" if bad else "")

    @check(DATASET, severity="warn")
    def enough_rows(part):
        """Warns on a day of fewer than 10 rows."""
        rows = part.materialization.rows or 0
        return CheckResult(rows >= 10, {"rows": rows}, f"only {rows} rows" if rows < 10 else "")


def declare_consumer() -> None:
    register_script(
        CONSUMER,
        path=str(SPARK_SCRIPTS / "pi.py"),
        params=[{"name": "day", "type": "date", "required": True}],
        consumes={DATASET: "day"},
    )
