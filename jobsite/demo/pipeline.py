"""`demo_pipeline`: the shipped demo workflow, runnable with no parameters (day defaults to yesterday, UTC).

    plan (task) -- fans out one `demo.sample_file` step per region, each writing that region's events of the day
      -> events (task: records the day's files as a materialization of the dataset demo.events, whose checks run;
         waits for every sample_file: the fan-in)
      -> rollup (Spark demo_rollup, file_rollup of the day's files into demo.rollup; it consumes demo.events[day],
         so it waits, `blocked`, while that partition's blocking check is pending or failed)
      -> analytics (Spark demo_analytics, queue_analytics of the demo's own work: the attempts of its steps, run
         today, into demo.analytics)
      -> summary (task: the rollup's and the analytics' metrics)

The datasets, their checks and the two jobs are declared in data.py beside this module. Files go under
the first dataset root (JOBSITE_VAR_DIR by default)/demo_pipeline/ (input/<day>/, rollup/). Re-running a day
replaces its files and its rollup partition (file_rollup overwrites the partitions it writes), so `workflow
backfill demo_pipeline` over a week can be run again safely. The sample data marks one day bad
(demo_data.BAD_DAY): `--param day=2025-01-13` shows a warn check warning and a blocking check holding the rollup.
"""

import csv
import datetime as dt
import os
import zlib
from typing import Any

from queue_app.datasets import services as datasets
from queue_app.datasets.models import Materialization
from queue_app.params import Param
from queue_app.registry import Context, job
from queue_app.spark.pipelines.file_rollup import SAMPLE_REGIONS, write_sample_input
from queue_app.workflows import services
from queue_app.workflows.definition import workflow

from . import data as demo_data

ROWS_PER_FILE = 2_000


def _root() -> str:
    return demo_data.demo_dir()


def _yesterday() -> dt.date:
    return dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)


def _own_attempts_window() -> dict[str, str]:
    """queue_analytics' window over the attempts this run's steps make: from the day it starts (UTC) to the end
    of the next (a run across midnight). `day` names the sample data, whose day has no queue attempts on a fresh
    install: analysing it succeeded with 0 rows."""
    today = dt.datetime.now(dt.UTC).date()
    return {"since": today.isoformat(), "until": (today + dt.timedelta(days=2)).isoformat()}


@job("demo.plan_files")
def plan_files(payload: Any, ctx: Context) -> dict[str, Any]:
    """Fan out: one sample_file step per region."""
    regions = list(SAMPLE_REGIONS)
    services.fan_out(ctx, "demo.sample_file", {r: {**payload, "region": r} for r in regions}, group="sample_file")
    return {"regions": regions}


@job("demo.sample_file")
def sample_file(payload: Any, ctx: Context) -> dict[str, Any]:
    """Write one region's sample events of the day (a temporary name, then renamed: a re-run replaces it) and
    record it as the day's partition of that region in demo.region_events ("2025-01-13|north")."""
    written = _write_region(dt.date.fromisoformat(payload["day"]), payload["region"], payload["input_dir"], ctx.item_id)
    datasets.record_materialization(
        demo_data.REGION_EVENTS,
        {"day": payload["day"], "region": payload["region"]},
        rows=written["rows"],
        files=1,
        bytes=os.path.getsize(written["file"]),
        item_id=ctx.item_id,
    )
    return written


@job("demo.weekly_rollup")
def weekly_rollup(payload: Any, ctx: Context) -> dict[str, Any]:
    """A week of demo.rollup (the trigger's payload names its seven days' materializations): their rows summed,
    recorded as the week's partition of demo.weekly_rollup."""
    read = sorted(payload["upstream"].values())
    rows = sum(m.rows or 0 for m in Materialization.objects.filter(id__in=read))
    datasets.record_materialization(
        demo_data.WEEKLY, payload["partition"], rows=rows, item_id=ctx.item_id, metadata={"days": len(read)}
    )
    return {"week": payload["partition"], "days": len(read), "rows": rows}


def _write_region(day: dt.date, region: str, folder: str, item_id: int) -> dict[str, Any]:
    scratch = os.path.join(folder, f".tmp-{region}-{item_id}")
    [path] = write_sample_input(
        scratch, rows=ROWS_PER_FILE, days=1, start=day, seed=zlib.crc32(f"{day} {region}".encode())
    )
    rows = _spoil(path, day, region)
    final = os.path.join(folder, f"events-{day}-{region}.csv")
    os.replace(path, final)
    os.rmdir(scratch)
    return {"file": final, "rows": rows}


def _spoil(path: str, day: dt.date, region: str) -> int:
    """On the sample data's bad day: one region's file holds only its header, another's every tenth row has
    quantity 0. Returns the rows the file holds."""
    if day != demo_data.BAD_DAY or region not in (demo_data.BAD_REGION_EMPTY, demo_data.BAD_REGION_ZERO):
        return ROWS_PER_FILE
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    if region == demo_data.BAD_REGION_EMPTY:
        rows = []
    else:
        quantity = header.index("quantity")
        for row in rows[::10]:
            row[quantity] = "0"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return len(rows)


@job("demo.write_events", produces=[demo_data.EVENTS])
def write_events(payload: Any, ctx: Context) -> dict[str, Any]:
    """demo.events' producer (`dataset materialize demo.events --partition DAY`): every region's sample file of
    the day, as the workflow's sample_file steps write them; its success records the partition (registry.py)."""
    day = dt.date.fromisoformat(payload["partition"])
    folder = os.path.join(_root(), "input", day.isoformat())
    os.makedirs(folder, exist_ok=True)
    rows = sum(_write_region(day, region, folder, ctx.item_id)["rows"] for region in SAMPLE_REGIONS)
    return {"rows": rows, "files": len(SAMPLE_REGIONS)}


@job("demo.events_landed")
def events_landed(payload: Any, ctx: Context) -> dict[str, Any]:
    """Record the day's files as the partition of demo.events (its checks run next, as items of their own)."""
    seen = datasets.observe(demo_data.EVENTS, payload["day"], metadata={"workflow_item": ctx.item_id})
    return {"dataset": demo_data.EVENTS, "partition": seen.partition, "files": seen.files, "bytes": seen.bytes}


@job("demo.summary")
def summary(payload: Any, ctx: Context) -> dict[str, Any]:
    got = services.upstream(ctx)
    return {"day": payload["day"], **{name: result for name, result in got.items()}}


@workflow(
    "demo_pipeline", params=[Param("day", "date", default=_yesterday, help="Day to process (default: yesterday)")]
)
def demo_pipeline(wf, params):
    """Sample files for a day (fan-out per region) -> events -> demo_rollup -> demo_analytics -> summary."""
    day = params["day"].isoformat()
    input_dir = os.path.join(_root(), "input", day)
    os.makedirs(input_dir, exist_ok=True)  # file_rollup's input_dir must exist when its params are checked
    plan = wf.task("demo.plan_files", {"day": day, "input_dir": input_dir}, name="plan")
    events = wf.task("demo.events_landed", {"day": day}, name="events", after=[plan])
    rollup = wf.spark(
        "demo_rollup",
        {"input_dir": input_dir, "output_dir": os.path.join(_root(), "rollup"), "day": day},
        name="rollup",
        after=[events],
    )
    analytics = wf.spark("demo_analytics", _own_attempts_window(), name="analytics", after=[rollup])
    wf.task("demo.summary", {"day": day}, name="summary", after=[rollup, analytics])
