"""Data checks declared per dataset: functions over a partition and declared schemas (pandera), each with a
severity, and what running one gives (passed, figures, message). Run by datasets/checks_run.py.

    from queue_app.datasets.quality import CheckResult, check, schema_check

    @check("events", severity="error")              # blocking=True by default for an error check
    def has_rows(part):                             # part: a Partition (dataset, key, materialization, path)
        return CheckResult(bool(part.materialization.rows), figures={"rows": part.materialization.rows})

    @check("events", on="pandas", fmt="csv", severity="warn")
    def few_nulls(df, part):                        # a pandas DataFrame read from the partition's files
        nulls = int(df["user_id"].isna().sum())
        return CheckResult(nulls == 0, figures={"null_count": nulls}, message=f"{nulls} null user ids")

    @check("events", on="spark")                    # a Spark DataFrame read by a local SparkSession
    def spark_rows(df, part): return df.count() > 0

    schema_check("events", pa.DataFrameSchema({...}), name="schema")   # pandera, pandas or pandera.pyspark

A check returns a bool or a CheckResult; an exception is a failed result saying so. Checks are declared in the
modules that declare datasets (an app's datasets.py, DATASET_MODULES), found when those are, or in the
DATASET_CHECKS setting by dotted path ({"dataset": "events", "function": "myapp.checks.has_rows"} or
{"dataset": "events", "schema": "myapp.schemas.EVENTS"}, with the same options), imported when first read; an
entry that cannot be used is left out and reported by jobsite.E123. A declaration is
checked for shape when made (TypeError/ValueError for what no Django start could survive anyway: not a callable,
not a name); what depends on other declarations (an unknown dataset, a duplicate name, a bad severity) is reported
by the system checks jobsite.E120-E122 (checks.py), so a bad declaration never stops Django from starting.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

from queue_app.conf import queue_settings

from .declarations import Dataset
from .locations import LocationError
from .models import Materialization

SEVERITIES = ("warn", "error")
ON = ("partition", "pandas", "spark")
FORMATS = ("parquet", "csv", "json")
MAX_MESSAGE = 2000


@dataclass(frozen=True)
class CheckResult:
    """What a check found: `passed`, figures (JSON numbers or text, e.g. {"null_count": 3}) and a message."""

    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True)
class DataCheck:
    dataset: str
    name: str
    func: Callable[..., Any] | None = field(repr=False, compare=False)
    on: str = "partition"  # partition: func(part); pandas/spark: func(df, part)
    severity: str = "error"
    blocking: bool = True
    schema: Any = field(default=None, repr=False, compare=False)  # a pandera schema (schema_check)
    fmt: str = "parquet"  # how pandas/spark read a path dataset's partition
    origin: str = ""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "severity": self.severity, "blocking": self.blocking, "on": self.on}


@dataclass(frozen=True)
class Partition:
    """What a partition check is given: the dataset, the partition's key, its materialization, and the
    partition's path (None for a table)."""

    dataset: Dataset
    key: str
    materialization: Materialization

    @property
    def path(self) -> str | None:
        if self.dataset.location.table:
            return None
        return self.dataset.location.resolve(self.key)

    def files(self) -> list[str]:
        """The partition's data files (not Spark's hidden _SUCCESS / .crc files), sorted."""
        path = self.path
        if path is None or not os.path.exists(path):
            return []
        if os.path.isfile(path):
            return [path]
        found = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            found += [os.path.join(folder, n) for n in names if not n.startswith(("_", "."))]
        return sorted(found)


_checks: list[DataCheck] = []


def _origin() -> str:
    caller = sys._getframe(2)
    return f"{caller.f_globals.get('__name__', '?')}:{caller.f_lineno}"


def _declare(item: DataCheck) -> DataCheck:
    # The same declaration imported again (a module reloaded) replaces itself rather than counting twice.
    _checks[:] = [c for c in _checks if not (c.origin == item.origin and c.name == item.name)]
    _checks.append(item)
    return item


def _blocking(severity: Any, blocking: bool | None) -> bool:
    return severity == "error" if blocking is None else bool(blocking)


def check(
    dataset: str,
    *,
    name: str | None = None,
    severity: str = "error",
    blocking: bool | None = None,
    on: str = "partition",
    fmt: str = "parquet",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the decorated function a check of `dataset` (see the module's docstring); `name` defaults to the
    function's name. `blocking` defaults to True for an error check, False for a warn check."""

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(func):
            raise TypeError(f"a check of dataset {dataset!r} must be a function, not {func!r}")
        if on not in ON or fmt not in FORMATS:
            raise ValueError(f"check {name or func.__name__!r}: on is one of {ON}, fmt one of {FORMATS}")
        caller = sys._getframe(1)
        origin = f"{caller.f_globals.get('__name__', '?')}:{caller.f_lineno}"
        _declare(
            DataCheck(
                dataset, name or func.__name__, func, on, severity, _blocking(severity, blocking), None, fmt, origin
            )
        )
        return func

    return register


def schema_check(
    dataset: str,
    schema: Any,
    *,
    name: str = "schema",
    severity: str = "error",
    blocking: bool | None = None,
    fmt: str = "parquet",
) -> DataCheck:
    """Declare a pandera schema check of `dataset`: a `pandera.pandas.DataFrameSchema` (or DataFrameModel)
    validates a pandas DataFrame of the partition, a `pandera.pyspark` one a Spark DataFrame."""
    if not hasattr(schema, "validate"):
        raise TypeError(f"schema check {name!r} of dataset {dataset!r}: a pandera schema, not {schema!r}")
    if fmt not in FORMATS:
        raise ValueError(f"schema check {name!r}: fmt is one of {FORMATS}")
    return _declare(
        DataCheck(
            dataset, name, None, _schema_on(schema), severity, _blocking(severity, blocking), schema, fmt, _origin()
        )
    )


def _schema_on(schema: Any) -> str:
    """What a pandera schema validates: a pandera.pyspark schema a Spark DataFrame, any other a pandas one."""
    pyspark = "pyspark" in type(schema).__module__ or "pyspark" in getattr(schema, "__module__", "")
    return "spark" if pyspark else "pandas"


def all_checks() -> list[DataCheck]:
    """The checks declared in code, then those of the DATASET_CHECKS setting."""
    return [*_checks, *settings_checks()[0]]


# -- declared in settings ---------------------------------------------------------------------------------------

CHECK_SETTINGS_KEYS = {"dataset", "function", "schema", "name", "severity", "blocking", "on", "fmt"}
_parsed: list[Any] = [None, None]  # [the DATASET_CHECKS value last parsed, what it gave]


def settings_checks() -> tuple[list[DataCheck], dict[str, str]]:
    """The checks the DATASET_CHECKS setting declares, and {"DATASET_CHECKS[i]": why} for entries that cannot be
    used (reported by the system check jobsite.E123 and left out). Parsed once per settings object: the entries'
    functions and schemas are imported then (a path that cannot be imported is such an entry)."""
    raw = queue_settings.DATASET_CHECKS
    if _parsed[0] is not raw:
        _parsed[:] = [raw, _parse_settings(raw)]
    return _parsed[1]


def _parse_settings(raw: Any) -> tuple[list[DataCheck], dict[str, str]]:
    if not isinstance(raw, list | tuple):
        return [], {"DATASET_CHECKS": "a list of checks ([{dataset: ..., function: 'module.name'}, ...])"}
    found, errors = [], {}
    for index, entry in enumerate(raw):
        where = f"DATASET_CHECKS[{index}]"
        try:
            found.append(_settings_check(entry, where))
        except (TypeError, ValueError, ImportError) as exc:
            errors[where] = str(exc)
    return found, errors


def _settings_check(entry: Any, where: str) -> DataCheck:
    if not isinstance(entry, Mapping):
        raise TypeError("a check is a mapping with a dataset and a function or a schema")
    if unknown := set(entry) - CHECK_SETTINGS_KEYS:
        raise ValueError(f"unknown keys {', '.join(sorted(map(str, unknown)))} (known: {sorted(CHECK_SETTINGS_KEYS)})")
    dataset, name = entry.get("dataset"), entry.get("name")
    if not isinstance(dataset, str) or not dataset:
        raise ValueError("'dataset' names a declared dataset")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError("'name' is a non-empty string")
    if ("function" in entry) == ("schema" in entry):
        raise ValueError(
            "give one of 'function' (the dotted path of a check function) or 'schema' (of a pandera schema)"
        )
    severity, fmt, on = entry.get("severity", "error"), entry.get("fmt", "parquet"), entry.get("on", "partition")
    blocking = entry.get("blocking")
    if blocking is not None and not isinstance(blocking, bool):
        raise ValueError("'blocking' is true or false")
    if on not in ON or fmt not in FORMATS:
        raise ValueError(f"'on' is one of {ON}, 'fmt' one of {FORMATS}")
    kind = "function" if "function" in entry else "schema"
    target = _imported(entry[kind], kind)
    if kind == "function":
        if not callable(target):
            raise TypeError(f"{entry[kind]!r} is not a function")
        return DataCheck(
            dataset, name or target.__name__, target, on, severity, _blocking(severity, blocking), None, fmt, where
        )
    if not hasattr(target, "validate"):
        raise TypeError(f"{entry[kind]!r} is not a pandera schema (it has no validate())")
    on = _schema_on(target)
    return DataCheck(dataset, name or "schema", None, on, severity, _blocking(severity, blocking), target, fmt, where)


def _imported(path: Any, kind: str) -> Any:
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"'{kind}' is a dotted path like 'myapp.checks.has_rows', not {path!r}")
    try:
        return import_string(path)
    except ImportError as exc:
        raise ImportError(f"'{kind}' {path!r} cannot be imported: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a module failing on import is the entry's error, not Django's
        raise ImportError(f"'{kind}' {path!r} failed on import: {type(exc).__name__}: {exc}") from None


def undeclare(item: DataCheck) -> None:
    """Forget a declaration (tests)."""
    _checks[:] = [c for c in _checks if c is not item]


def checks_for(dataset: str) -> list[DataCheck]:
    """The checks of `dataset` that can run: a valid severity, and the first of a duplicated name."""
    found: dict[str, DataCheck] = {}
    for item in all_checks():
        if item.dataset == dataset and item.severity in SEVERITIES:
            found.setdefault(item.name, item)
    return list(found.values())


def get_check(dataset: str, name: str) -> DataCheck | None:
    return next((c for c in checks_for(dataset) if c.name == name), None)


# -- running one ----------------------------------------------------------------------------------------------


def run(item: DataCheck, part: Partition) -> CheckResult:
    """Run one check on one partition; any exception is a failed result that says what was raised."""
    try:
        if item.on == "partition":
            outcome = item.func(part)
        else:
            frame = read_pandas(part, item.fmt) if item.on == "pandas" else read_spark(part, item.fmt)
            outcome = _validate(item.schema, frame, item.on) if item.schema is not None else item.func(frame, part)
    except Exception as exc:  # the check's own failure is its result, never the worker's
        return CheckResult(False, {}, f"the check raised {type(exc).__name__}: {exc}"[:MAX_MESSAGE])
    if isinstance(outcome, CheckResult):
        return CheckResult(bool(outcome.passed), dict(outcome.figures), str(outcome.message)[:MAX_MESSAGE])
    if isinstance(outcome, bool):
        return CheckResult(outcome)
    return CheckResult(False, {}, f"a check returns a bool or a CheckResult, not {type(outcome).__name__}")


def _path_files(part: Partition) -> list[str]:
    if part.dataset.location.table:
        raise LocationError(f"{part.dataset.location.text} is a table: a pandas or Spark check reads files")
    files = part.files()
    if not files:
        raise LocationError(f"no data files at {part.path}")
    return files


def read_pandas(part: Partition, fmt: str) -> Any:
    """The partition's files as one pandas DataFrame."""
    import pandas as pd  # an optional dependency (the spark extra): only a pandas check needs it

    files = _path_files(part)
    if fmt == "parquet":
        return pd.read_parquet(part.path if len(files) > 1 else files[0])
    reader = pd.read_csv if fmt == "csv" else (lambda f: pd.read_json(f, lines=True))
    return pd.concat([reader(f) for f in files], ignore_index=True)


def read_spark(part: Partition, fmt: str) -> Any:
    """The partition's files as a Spark DataFrame, read by a local SparkSession of this worker process."""
    from pyspark.sql import SparkSession  # optional (the spark extra): only a Spark check needs it

    _path_files(part)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("jobsite-dataset-check")
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)  # a check's Python UDFs: this interpreter's version
        .getOrCreate()
    )
    return getattr(spark.read, fmt)(part.path)


def _validate(schema: Any, frame: Any, on: str) -> CheckResult:
    """A pandera schema's verdict, with figures: rows, null counts per column, failure cases."""
    if on == "spark":
        checked = schema.validate(frame)
        errors = dict(getattr(checked.pandera, "errors", {}) or {})
        count = sum(len(v) for kinds in errors.values() for v in kinds.values())
        return CheckResult(not errors, {"failure_cases": count}, str(errors)[:MAX_MESSAGE] if errors else "")
    import pandera.errors  # optional (the spark extra, with pandas): only a schema check needs it

    figures = {"rows": len(frame), "null_count": {c: int(n) for c, n in frame.isna().sum().items() if n}}
    try:
        schema.validate(frame, lazy=True)
    except pandera.errors.SchemaErrors as exc:
        cases = exc.failure_cases
        figures["failure_cases"] = len(cases)
        shown = "; ".join(
            f"{row.get('column')}: {row.get('check')} ({row.get('failure_case')})"
            for row in cases.head(5).to_dict("records")
        )
        return CheckResult(False, figures, f"{len(cases)} failure cases: {shown}"[:MAX_MESSAGE])
    except pandera.errors.SchemaError as exc:
        return CheckResult(False, figures, str(exc)[:MAX_MESSAGE])
    return CheckResult(True, figures)
