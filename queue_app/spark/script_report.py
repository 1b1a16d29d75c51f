"""The channel a Spark run's program reports its own figures through (jobsite/spark_report.py writes it).

- channel(run_id): the run's report file, `<the run's event log directory>/reports/report.jsonl` (pruned with
  the run's event logs); prepare(run_id) empties it before an attempt starts (an earlier attempt's reports are
  not this one's) and gives the path the launcher puts in the child's JOBSITE_SPARK_REPORT.
- read(run_id): the reports, one per (dataset, partition), later calls' figures over earlier ones'.
- merge(outputs, reports, run_id, partition_key): the run's output figures (datasets/spark_runs.py, which gives the
  datasets' partition keys) with the reported rows in place of the event log's, and the reported metadata (and
  preview) added; read before the transaction that records them.
  A report of a dataset or partition the run does not produce, or one that cannot be read, is left out with a
  warning: it never fails the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from . import eventlog

# The channel's two ends agree on these: jobsite/spark_report.py, the writer a PySpark script imports, is plain Python
# and imports no app, so it names them too (tests/spark/in_process/test_spark_report.py holds the two equal).
ENV = "JOBSITE_SPARK_REPORT"  # the variable naming the run's report file
PREVIEW_ROWS = 20  # rows of a preview kept, at most

logger = logging.getLogger("jobsite.spark")

MAX_BYTES = 1 << 20  # read at most this much of a run's reports
MAX_METADATA = 60_000  # bytes of a materialization's metadata as JSON (the record allows 64 KiB)

__all__ = ["ENV", "channel", "merge", "prepare", "read"]


def channel(run_id: int | str) -> str:
    return os.path.join(eventlog.run_dir(run_id), "reports", "report.jsonl")


def prepare(run_id: int | str) -> str:
    """An empty channel for the attempt about to start; its path."""
    path = channel(run_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return path


def read(run_id: int | str) -> dict[tuple[str, str | None], dict[str, Any]]:
    """{(dataset, partition as reported): {"rows", "metadata", "preview"}}; bad lines are skipped (logged)."""
    try:
        with open(channel(run_id), "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return {}
    if len(data) > MAX_BYTES:
        logger.warning("spark run %s: its reports pass %s bytes; the rest is left out", run_id, MAX_BYTES)
        data = data[: data.rfind(b"\n", 0, MAX_BYTES) + 1]
    found: dict[tuple[str, str | None], dict[str, Any]] = {}
    for number, line in enumerate(data.splitlines(), 1):
        try:
            record = json.loads(line)
            key = (record["dataset"], record["partition"])
            rows, metadata = record.get("rows"), record.get("metadata") or {}
            if not isinstance(key[0], str) or not isinstance(metadata, dict):
                raise ValueError("a dataset name and a metadata mapping")
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("spark run %s: report line %s left out (%s)", run_id, number, exc)
            continue
        seen = found.setdefault(key, {"rows": None, "metadata": {}, "preview": None})
        if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0:
            seen["rows"] = rows
        seen["metadata"].update(metadata)
        if isinstance(record.get("preview"), list):
            seen["preview"] = record["preview"][:PREVIEW_ROWS]
    return found


def merge(
    outputs: list[dict],
    reports: dict[tuple[str, str | None], dict[str, Any]],
    run_id: int | str,
    partition_key: Callable[[str, str], str | None],
) -> None:
    """Apply `reports` to the run's `outputs` in place (see the module's docstring). `partition_key(dataset,
    partition)` is a reported partition's canonical key (None: not a partition of that dataset), which the caller
    that knows the datasets gives (datasets/spark_runs.py): this module imports none of them."""
    by_key = {(out["dataset"], out["partition"]): out for out in outputs}
    for (name, partition), report in reports.items():
        out = _target(name, partition, by_key, outputs, partition_key)
        if out is None:
            logger.warning(
                "spark run %s reported %s[%s], which it does not produce: left out", run_id, name, partition or ""
            )
            continue
        if report["rows"] is not None:
            out["rows"] = report["rows"]
        metadata = {**out.get("metadata", {}), **report["metadata"]}
        if report["preview"] is not None:
            metadata["preview"] = report["preview"]
        if _size(metadata) > MAX_METADATA and "preview" in metadata:
            logger.warning("spark run %s: the preview of %s[%s] is too large: left out", run_id, name, partition)
            metadata.pop("preview")
        if _size(metadata) > MAX_METADATA:
            logger.warning("spark run %s: the metadata of %s[%s] is too large: left out", run_id, name, partition)
            continue
        out["metadata"] = metadata


def _target(
    name: str, partition: str | None, by_key: dict, outputs: list[dict], partition_key: Callable[[str, str], str | None]
) -> dict | None:
    """The output a report names: its canonical partition, or the run's one partition of the dataset."""
    if partition is None:
        mine = [out for out in outputs if out["dataset"] == name]
        return mine[0] if len(mine) == 1 else None
    key = partition_key(name, partition)
    return None if key is None else by_key.get((name, key))


def _size(metadata: dict[str, Any]) -> int:
    return len(json.dumps(metadata, default=str))
