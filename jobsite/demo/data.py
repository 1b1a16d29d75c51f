"""The demo's datasets, their checks and the two Spark jobs between them: what `demo_pipeline` reads and writes.

    demo.events     the sample event files of a day (CSV, one per region), written by the demo's task steps and
                    recorded with `observe`, or by its producer task demo.write_events (`dataset materialize`);
                    checked: a warn check (every region sent rows) and a blocking one (no quantity below 1)
      -> demo_rollup   (file_rollup under another name: consumes demo.events[day], produces demo.rollup[day])
    demo.rollup     the day's Parquet rollup (file_rollup's event_date=DAY directories); its declared params give
                    demo_rollup the day's input and the output directory, so `dataset materialize` needs only
                    the partition
      -> demo_analytics (queue_analytics under another name: consumes demo.rollup, produces demo.analytics)
    demo.analytics  the queue statistics table queue_analytics publishes
    demo.region_events  the same files by day *and* region (two dimensions, "2025-01-13|north"), recorded by each
                    sample_file step for its region
    demo.weekly_rollup  a week of demo.rollup (ISO weeks, "2025-W03"): the task demo.weekly_rollup, triggered
                    once all seven days of the week are rolled up (a TimeWindow mapping to weekly)

The locations are relative, so they lie under the first dataset root (settings.VAR_DIR by default) whatever the
roots are (no jobsite.E102); the demo writes its files where these locations resolve (demo_dir()). The sample
data marks one day bad (BAD_DAY): its west region sends nothing (the warn check warns) and some of its east rows
have quantity 0 (the blocking check fails, so the rollup of that day waits, `blocked`, until someone overrides
it or the day is written again). Imported by the demo app's datasets.py and spark_jobs.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os

from queue_app.datasets import Freshness, MultiPartitions, StaticPartitions, dataset
from queue_app.datasets.locations import dataset_roots
from queue_app.datasets.mappings import TimeWindow
from queue_app.datasets.quality import CheckResult, check
from queue_app.datasets.refs import dataset_refs
from queue_app.datasets.triggers import trigger_task
from queue_app.spark.pipelines import file_rollup, queue_analytics  # noqa: F401 (registers the jobs varied below)
from queue_app.spark.pipelines.file_rollup import SAMPLE_REGIONS
from queue_app.spark.registry import code_job, register

EVENTS, ROLLUP, ANALYTICS = "demo.events", "demo.rollup", "demo.analytics"
REGION_EVENTS, WEEKLY = "demo.region_events", "demo.weekly_rollup"
DIRECTORY = "demo_pipeline"  # under the first dataset root
BAD_DAY = dt.date(2025, 1, 13)  # the day the demo's sample data marks bad
BAD_REGION_EMPTY, BAD_REGION_ZERO = "west", "east"

dataset(
    EVENTS,
    location=f"{DIRECTORY}/input/{{partition}}",
    partitioning="daily",
    owner="demo",
    description="The demo's sample event files of a day, one CSV per region (demo_pipeline's sample_file steps).",
    freshness=Freshness(partition_by="06:00"),
)
dataset(
    ROLLUP,
    location=f"{DIRECTORY}/rollup/event_date={{partition}}",
    partitioning="daily",
    owner="demo",
    description="Per day, region and product: rows and sums of quantity and amount (Parquet, by demo_rollup).",
    freshness=Freshness(partition_by="06:00"),
    params={"input_dir": f"{{root}}/{DIRECTORY}/input/{{partition}}", "output_dir": f"{{root}}/{DIRECTORY}/rollup"},
)
dataset(
    ANALYTICS,
    location="table:public.queue_app_queuestats_hourly",
    owner="demo",
    description="Per queue, task and hour: what the queue did (demo_analytics after the rollup).",
    freshness=Freshness(max_age=dt.timedelta(hours=26)),
)

dataset(
    REGION_EVENTS,
    location=f"{DIRECTORY}/input",
    partitioning=MultiPartitions(day="daily", region=StaticPartitions(SAMPLE_REGIONS)),
    owner="demo",
    description="The demo's sample event files by day and region (each sample_file step records its region).",
)
dataset(
    WEEKLY,
    location=f"{DIRECTORY}/weekly/{{partition}}",
    partitioning="weekly",
    owner="demo",
    description="A week of demo.rollup: rows summed over its seven days (the task demo.weekly_rollup).",
)
# The weekly rollup runs once per week, when each of its seven days of demo.rollup is materialized (and usable).
trigger_task("demo.weekly_rollup", on_update={ROLLUP: TimeWindow(to="weekly")}, produces=[WEEKLY])


def demo_dir(*parts: str) -> str:
    """Where the demo's files live: DIRECTORY under the first dataset root (where the locations resolve)."""
    return os.path.join(dataset_roots()[0], DIRECTORY, *parts)


@check(EVENTS, severity="warn")
def every_region_sent_rows(part):
    """Warn: a region's file of the day holds no rows (only its header)."""
    files = part.files()
    empty = []
    for path in files:
        with open(path) as f:
            if sum(1 for _ in f) <= 1:
                empty.append(os.path.basename(path))
    message = f"no rows in {', '.join(empty)}" if empty else ""
    return CheckResult(not empty, figures={"files": len(files), "empty_files": len(empty)}, message=message)


@check(EVENTS, severity="error", on="pandas", fmt="csv")
def quantities_positive(df, part):
    """Block: a row whose quantity is below 1 (the rollup would sum it)."""
    bad = int((df["quantity"] < 1).sum()) if len(df) else 0
    message = f"{bad} row(s) with quantity below 1" if bad else ""
    return CheckResult(bad == 0, figures={"rows": len(df), "bad_quantity": bad}, message=message)


def _register_variant(name: str, base: str, description: str, **changes) -> None:
    """Register the shipped job `base` again as `name`, declaring the demo's datasets (the generic job declares
    none: its output goes wherever its parameters say)."""
    job = code_job(base)
    register(dataclasses.replace(job, name=name, description=description, **changes))


_register_variant(
    "demo_rollup",
    "file_rollup",
    "Demo: file_rollup of demo.events[day] into demo.rollup[day].",
    params=tuple(
        dataclasses.replace(p, required=True) if p.name == "day" else p for p in code_job("file_rollup").params
    ),
    consumes=dataset_refs({EVENTS: "day"}, what="Spark job 'demo_rollup': consumes"),
    produces=dataset_refs({ROLLUP: "day"}, what="Spark job 'demo_rollup': produces"),
)
_register_variant(
    "demo_analytics",
    "queue_analytics",
    "Demo: queue_analytics after the rollup, into demo.analytics.",
    consumes=dataset_refs([ROLLUP], what="Spark job 'demo_analytics': consumes"),
    produces=dataset_refs([ANALYTICS], what="Spark job 'demo_analytics': produces"),
)
