"""The datasets' state changes, one function each, shared by the CLI, the admin, the worker and code.

- record_materialization: a partition of a dataset was written; called inside the transaction that marks its
  producer (a Spark run, a workflow step, an item) succeeded, so the record and the success commit together.
- observe: a partition written outside jobsite; its files are counted and sized under the dataset's location.

A recorded materialization's checks (datasets/checks_run.py) start in the same transaction: pending results and
one check item each, and `checks` = pending while a blocking check has not run.

Both validate everything before writing (an unknown dataset, a partition that does not fit, bad figures: a
DatasetError and nothing written) and write one statement (sql.RECORD: the dataset's row made sure of and the
materialization inserted, atomic without a savepoint; two more for a dataset with checks) in the caller's
transaction, so a caller that rolls back leaves nothing. A materialization is announced to the data-aware
triggers (triggers.materialization_usable) in the transaction that makes it usable: its record when it has no
blocking checks (checks_run.start), else when its last blocking check passes or its failures are overridden
(checks_run.became_usable).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ..engine.alias import atomic, connection
from . import checks_run
from .declarations import Dataset, DatasetError, get_dataset
from .locations import LocationError, dataset_roots, within_roots
from .models import USABLE_CHECK_STATES, Materialization, MaterializationSource
from .quality import checks_for
from .sql import RECORD

MAX_METADATA_BYTES = 65_536
MAX_FIGURE = 2**63 - 1


def _figure(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FIGURE:
        raise DatasetError(f"{name} must be a whole number from 0 to {MAX_FIGURE}, got {value!r}")
    return value


def schema_fingerprint(schema: Any) -> str:
    """A stable fingerprint of a schema given as JSON-able data (e.g. a Spark `df.schema.jsonValue()`): the
    SHA-256 of its canonical JSON. '' for no schema."""
    if schema is None:
        return ""
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise DatasetError("schema must be JSON data (e.g. a Spark DataFrame's schema.jsonValue())") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _metadata(metadata: Any) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise DatasetError("metadata must be a mapping with string keys")
    try:
        size = len(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError):
        raise DatasetError("metadata must be JSON data") from None
    if size > MAX_METADATA_BYTES:
        raise DatasetError(f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES}")
    return dict(metadata)


def _source(spark_run_id: Any, workflow_step_id: Any, item_id: Any, observed: bool) -> str:
    for name, value in (("spark_run_id", spark_run_id), ("workflow_step_id", workflow_step_id), ("item_id", item_id)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise DatasetError(f"{name} must be a positive id, got {value!r}")
    if observed:
        return MaterializationSource.OBSERVED
    if spark_run_id is not None:
        return MaterializationSource.SPARK_RUN
    if workflow_step_id is not None:
        return MaterializationSource.WORKFLOW_STEP
    return MaterializationSource.ITEM if item_id is not None else MaterializationSource.CODE


def record_materialization(
    dataset: str | Dataset,
    partition: Any = None,
    *,
    rows: int | None = None,
    bytes: int | None = None,  # noqa: A002 - the figure's name in the issue's JSON
    files: int | None = None,
    schema: Any = None,
    metadata: Mapping[str, Any] | None = None,
    spark_run_id: int | None = None,
    workflow_step_id: int | None = None,
    item_id: int | None = None,
    observed: bool = False,
) -> Materialization:
    """Record that `partition` (canonicalised: a date, datetime or key) of `dataset` was written, in the caller's
    transaction. The source is the first of spark_run_id, workflow_step_id, item_id given ("observed" for
    observe(), "code" for none); every id given is kept."""
    ds = dataset if isinstance(dataset, Dataset) else get_dataset(dataset)
    values = {
        "dataset": ds.name,
        "partition": ds.partition_key(partition),
        "rows": _figure("rows", rows),
        "bytes": _figure("bytes", bytes),
        "files": _figure("files", files),
        "schema_fingerprint": schema_fingerprint(schema),
        "metadata": _metadata(metadata),
        "source": _source(spark_run_id, workflow_step_id, item_id, observed),
        "spark_run_id": spark_run_id,
        "workflow_step_id": workflow_step_id,
        "item_id": item_id,
    }
    checks = checks_for(ds.name)
    values["checks"] = checks_run.initial_state(checks)
    columns = [values[c] for c in ("dataset", "partition", "rows", "bytes", "files", "schema_fingerprint")]
    columns += [json.dumps(values["metadata"])]
    columns += [values[c] for c in ("source", "spark_run_id", "workflow_step_id", "item_id", "checks")]
    # A dataset with checks writes three statements: in a transaction of their own when the caller has none, in
    # the caller's without a savepoint otherwise (as the one statement of a dataset without checks: a failure
    # fails the caller's transaction either way), so its rows carry the caller's transaction id and the settle
    # pays no SAVEPOINT / RELEASE round trips.
    with atomic(savepoint=False) if checks else contextlib.nullcontext():
        with connection.cursor() as cursor:
            usable = values["checks"] in USABLE_CHECK_STATES
            cursor.execute(
                RECORD,
                [ds.name, json.dumps(ds.config()), ds.declared_in, usable, ds.name, values["partition"], *columns],
            )
            row_id, at, released = cursor.fetchone()
        written = {"id": row_id, "at": at, **values}
        names = [f.attname for f in Materialization._meta.concrete_fields]  # from_db takes them in the model's order
        recorded = Materialization.from_db(connection.alias, names, [written[n] for n in names])
        checks_run.start(recorded, checks, released)  # its checks' items, or the usable announcement
    return recorded


def stat_files(path: str, roots: list[str], *, data_only: bool = False) -> tuple[int, int]:
    """(files, bytes) of the regular files at or under `path`; directory links are not followed and a file link
    that resolves outside `roots` is not counted (its size would tell what lies outside). `data_only` leaves out
    the files Spark and Hadoop treat as hidden (names starting with "_" or ".": _SUCCESS, .crc checksums)."""
    if os.path.isfile(path):
        return 1, os.stat(path).st_size
    files = size = 0
    for folder, _dirs, names in os.walk(path, followlinks=False):
        for name in names:
            if data_only and name.startswith(("_", ".")):
                continue
            full = os.path.join(folder, name)
            if os.path.islink(full) and not within_roots(os.path.realpath(full), roots):
                continue
            try:
                info = os.stat(full)
            except OSError:  # removed while walking, or a dangling link
                continue
            if os.path.isfile(full):
                files, size = files + 1, size + info.st_size
    return files, size


def observe(dataset: str, partition: Any = None, *, metadata: Mapping[str, Any] | None = None) -> Materialization:
    """Record `partition` of `dataset` as written outside jobsite. For a path location, its files (the
    partition's directory when the path holds {partition}) are counted and sized, and there must be at least
    one; a table location is recorded without figures."""
    ds = get_dataset(dataset)
    key = ds.partition_key(partition)
    if ds.location.table:
        return record_materialization(ds, key, metadata=metadata, observed=True)
    try:
        path = ds.location.resolve(key)
    except LocationError as exc:
        raise DatasetError(f"dataset {ds.name!r}: {exc}; nothing recorded") from None
    if not os.path.exists(path):
        raise DatasetError(f"dataset {ds.name!r}: nothing at {path}; nothing recorded")
    files, size = stat_files(path, dataset_roots())
    if files == 0:
        raise DatasetError(f"dataset {ds.name!r}: no files under {path}; nothing recorded")
    return record_materialization(ds, key, files=files, bytes=size, metadata=metadata, observed=True)
