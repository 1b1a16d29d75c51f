"""What a PySpark program launched by jobsite may report about the data it wrote: per dataset and partition, rows,
free metadata and a preview. Plain Python (no Django, no jobsite import), so any script can use it:

    from jobsite import spark_report

    df.write.parquet(f"/data/revenue/day={day}")
    spark_report.materialized("daily_revenue", day, rows=df.count(), metadata={"source": "landing"}, preview=df)

The launcher names a file in the run's directory in the environment variable JOBSITE_SPARK_REPORT; each call
appends one JSON line to it. When the run succeeds, jobsite reads the file and merges each report into the
materialization of that partition it records in the transaction that marks the run succeeded (the reported rows
replace the event log's figure; metadata is added to the materialization's). Run outside jobsite (no variable),
a call does nothing and returns False. See docs/how-to/datasets.md, "Report figures from a script".
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from typing import Any

ENV = "JOBSITE_SPARK_REPORT"
PREVIEW_ROWS = 20  # rows of a preview kept, at most


def materialized(
    dataset: str,
    partition: Any = None,
    *,
    rows: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    preview: Any = None,
) -> bool:
    """Report that this run wrote `partition` of `dataset` (None: its one partition). `preview` is a Spark or
    pandas DataFrame or a list of rows (dicts); its first PREVIEW_ROWS rows are kept. Returns whether a
    launcher's channel took the report."""
    path = os.environ.get(ENV)
    if not path:
        return False
    if not isinstance(dataset, str) or not dataset:
        raise ValueError("dataset is a declared dataset's name")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise ValueError(f"rows is a whole number >= 0, got {rows!r}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValueError("metadata is a mapping of JSON values")
    record = {
        "dataset": dataset,
        "partition": _partition(partition),
        "rows": rows,
        "metadata": dict(metadata or {}),
        "preview": _preview(preview),
    }
    line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write of one line: appends of concurrent writers do not interleave
    finally:
        os.close(fd)
    return True


def _partition(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return str(value)


def _preview(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if hasattr(value, "limit") and hasattr(value, "collect"):  # a Spark DataFrame
        return [row.asDict() for row in value.limit(PREVIEW_ROWS).collect()]
    if hasattr(value, "head") and hasattr(value, "to_dict"):  # a pandas DataFrame
        return value.head(PREVIEW_ROWS).to_dict("records")
    rows = list(value)[:PREVIEW_ROWS]
    return [dict(r) if isinstance(r, Mapping) else {"value": r} for r in rows]
