"""The Spark job registry: `@spark_job` entry points, their declared parameters, and parameter validation.

A Spark job is a function `(spark, params) -> metrics` registered under a name. Its parameters are declared
(`Param`), so a trigger (dashboard, schedule, CLI) can validate raw input *before* anything is queued and the
child process can rebuild the same typed values from JSON. Validation reports every bad field at once.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ParamType = Literal["int", "float", "str", "bool", "date", "choice", "path"]
PARAM_TYPES: tuple[str, ...] = ("int", "float", "str", "bool", "date", "choice", "path")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SparkJobError(Exception):
    """Base class of the registry's errors."""


class UnknownSparkJob(SparkJobError, LookupError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        known = sorted(known)
        super().__init__(f"unknown Spark job {name!r}; registered jobs: {', '.join(known) or '(none)'}")


class SparkParamError(SparkJobError, ValueError):
    """Bad parameters for a job; `errors` maps each bad field to what is wrong with it."""

    def __init__(self, job: str, errors: Mapping[str, str]) -> None:
        self.job = job
        self.errors = dict(errors)
        lines = "; ".join(f"{name}: {message}" for name, message in self.errors.items())
        super().__init__(f"invalid parameters for Spark job {job!r}: {lines}")


@dataclass(frozen=True)
class Param:
    """One declared parameter of a Spark job.

    `default` applies when the value is missing or an empty string (what an HTML form sends for an empty
    field); `choices` is required for type "choice"; `min`/`max` bound int and float; `must_exist` makes a
    "path" parameter check that the path exists when validated.
    """

    name: str
    type: ParamType = "str"
    required: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    must_exist: bool = False

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ValueError(f"param {self.name!r}: type must be one of {', '.join(PARAM_TYPES)}")
        if self.type == "choice" and not self.choices:
            raise ValueError(f"param {self.name!r}: a choice parameter needs choices")
        if self.required and self.default is not None:
            raise ValueError(f"param {self.name!r}: a required parameter cannot have a default")

    def coerce(self, value: Any) -> Any:
        """Typed value from a raw one (a string from a form or JSON, or already typed); ValueError if bad."""
        converted = _COERCE[self.type](self, value)
        if self.type in ("int", "float"):
            if self.min is not None and converted < self.min:
                raise ValueError(f"must be >= {_num(self.min)}")
            if self.max is not None and converted > self.max:
                raise ValueError(f"must be <= {_num(self.max)}")
        return converted

    def dump(self, value: Any) -> Any:
        """JSON-safe form of a typed value; `coerce(dump(v)) == v`."""
        if isinstance(value, dt.date):
            return value.isoformat()
        return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _to_int(param: Param, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"must be an integer, got {value!r}") from None


def _to_float(param: Param, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number")
    try:
        result = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number, got {value!r}") from None
    if result != result or result in (float("inf"), float("-inf")):
        raise ValueError("must be a finite number")
    return result


def _to_str(param: Param, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {type(value).__name__}")
    return value


def _to_bool(param: Param, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def _to_date(param: Param, value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        raise ValueError("must be a date (YYYY-MM-DD), not a date and time")
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a date as YYYY-MM-DD, got {value!r}") from None


def _to_choice(param: Param, value: Any) -> str:
    if value not in param.choices:
        raise ValueError(f"must be one of {', '.join(param.choices)}; got {value!r}")
    return value


def _to_path(param: Param, value: Any) -> str:
    if not isinstance(value, str | os.PathLike):
        raise ValueError(f"must be a path, got {type(value).__name__}")
    path = os.path.abspath(os.path.expanduser(os.fspath(value)))
    if param.must_exist and not os.path.exists(path):
        raise ValueError(f"{path} does not exist")
    return path


_COERCE: dict[str, Callable[[Param, Any], Any]] = {
    "int": _to_int,
    "float": _to_float,
    "str": _to_str,
    "bool": _to_bool,
    "date": _to_date,
    "choice": _to_choice,
    "path": _to_path,
}


@dataclass(frozen=True)
class JobResult:
    """What a job may return instead of a plain metrics dict: metrics plus outputs for its `publish` hook."""

    metrics: Mapping[str, Any] = field(default_factory=dict)
    outputs: Any = None


@dataclass(frozen=True)
class SparkJob:
    """A registered entry point.

        `publish(outputs, run_id)`, when set, makes the run's outputs visible; the caller runs it inside the same
        database transaction that marks the run succeeded, so a re-delivered run never publishes twice.
        `conf` is Spark configuration this job always wants (a run may add more). A job with `script` is an existing
    PySpark program run unmodified by path (scripts.py) instead of `func`. `check(values)` returns
        {field: message} for rules across fields (until after since); it runs once every field is valid.
    """

    name: str
    func: Callable[..., Any] | None  # None for a script: it runs as its own program (script: ScriptSpec)
    params: tuple[Param, ...] = ()
    description: str = ""
    conf: Mapping[str, str] = field(default_factory=dict)
    publish: Callable[[Any, int | str], Any] | None = None
    check: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None
    script: Any = None  # a scripts.ScriptSpec: an existing PySpark application spark-submit runs by path
    source: str = "code"  # where it was registered: code, settings or admin
    policy: Any = None  # a policy.SparkPolicy: concurrency, retries, timeout, resources, priority, retention
    # Called by trigger_run() on the validated values before they are stored: fills what is fixed when the run
    # is triggered (an incremental pipeline's window), so a re-run of the run computes exactly the same.
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(raw, Mapping):
            raise SparkParamError(self.name, {"__all__": f"parameters must be a mapping, got {type(raw).__name__}"})
        errors: dict[str, str] = {}
        values: dict[str, Any] = {}
        declared = {p.name for p in self.params}
        for name in raw:
            if name not in declared:
                errors[name] = f"unknown parameter (this job takes: {', '.join(sorted(declared)) or 'none'})"
        for param in self.params:
            value = raw.get(param.name)
            if value is None or (isinstance(value, str) and value.strip() == ""):
                if param.required:
                    errors[param.name] = "this parameter is required"
                else:
                    values[param.name] = param.default
                continue
            try:
                values[param.name] = param.coerce(value)
            except ValueError as exc:
                errors[param.name] = str(exc)
        if not errors and self.check is not None:
            errors.update(self.check(values))
        if errors:
            raise SparkParamError(self.name, errors)
        return values

    def dump_params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """JSON-safe params (for the child's --params-json and the SparkRun row)."""
        return {p.name: p.dump(values[p.name]) for p in self.params if values.get(p.name) is not None}


_registry: dict[str, SparkJob] = {}
_discovered = False


def spark_job(
    name: str,
    *,
    params: Iterable[Param] = (),
    description: str = "",
    conf: Mapping[str, str] | None = None,
    publish: Callable[[Any, int | str], Any] | None = None,
    check: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None,
    policy: Any = None,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `func(spark, params) -> dict | JobResult` as the Spark job `name`."""
    params = tuple(params)
    names = [p.name for p in params]
    if len(names) != len(set(names)):
        raise ValueError(f"Spark job {name!r} declares a parameter twice: {names}")

    def register_func(func: Callable[..., Any]) -> Callable[..., Any]:
        register(
            SparkJob(
                name=name,
                func=func,
                params=params,
                description=description or (func.__doc__ or "").strip().split("\n")[0],
                conf=dict(conf or {}),
                publish=publish,
                check=check,
                policy=policy,
                prepare=prepare,
            )
        )
        return func

    return register_func


def register(job: SparkJob) -> SparkJob:
    """Register `job` under its name; registering the same function (or script) again replaces it, another
    one under a taken name is refused."""
    existing = _registry.get(job.name)
    if existing is not None and _origin(existing) != _origin(job):
        raise ValueError(
            f"Spark job {job.name!r} is already registered by {_origin(existing)}, cannot register {_origin(job)}"
        )
    _registry[job.name] = job
    return job


def _origin(job: SparkJob) -> str:
    if job.func is None:
        return f"the {job.source} script {job.name!r}"
    return f"{job.func.__module__}.{job.func.__qualname__}"


class JobSource:
    """Jobs kept outside the code (the admin's stored scripts): found by name, listed for the trigger form."""

    def find(self, name: str) -> SparkJob | None:  # pragma: no cover - interface
        raise NotImplementedError

    def jobs(self) -> list[SparkJob]:  # pragma: no cover - interface
        raise NotImplementedError


_sources: list[JobSource] = []


def add_source(source: JobSource) -> None:
    _sources.append(source)


def autodiscover() -> None:
    """Import the modules named by the `SPARK_JOB_MODULES` setting (the shipped pipelines by default) and every
    installed app's `spark_jobs` module, once per process. Registration flows one way: those modules import this
    registry and register themselves; the registry names no module of its own."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    from importlib import import_module

    from django.apps import apps

    from queue_app.conf import queue_settings

    for module in queue_settings.SPARK_JOB_MODULES:
        import_module(module)
    if apps.ready:
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("spark_jobs")


def get_job(name: str) -> SparkJob:
    autodiscover()
    job = _registry.get(name)
    for source in _sources if job is None else ():
        if (job := source.find(name)) is not None:
            break
    if job is None:
        raise UnknownSparkJob(name, [j.name for j in all_jobs()])
    return job


def code_job(name: str) -> SparkJob | None:
    """The job registered under `name` in code or settings (not a stored one)."""
    autodiscover()
    return _registry.get(name)


def all_jobs() -> list[SparkJob]:
    autodiscover()
    jobs = dict(_registry)
    for source in _sources:
        for job in source.jobs():
            jobs.setdefault(job.name, job)  # the code's registration wins (the admin refuses such a name)
    return sorted(jobs.values(), key=lambda job: job.name)


def validate(job_name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Typed parameters for `job_name` from raw values; raises SparkParamError listing every bad field."""
    return get_job(job_name).validate(raw)
