"""The Spark job registry: `@spark_job` entry points, their declared parameters, and parameter validation.

A Spark job is a function `(spark, params) -> metrics` registered under a name. Its parameters are declared
(`Param`, queue_app/params.py), so a trigger (dashboard, schedule, CLI) can validate raw input *before* anything
is queued and the child process can rebuild the same typed values from JSON. Validation reports every bad field at
once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from queue_app.dataset_refs import DatasetRef, OnUpdate, dataset_refs, on_update_of
from queue_app.params import Param, ParamError, validate_params
from queue_app.registries import Registry, origin_of


class SparkJobError(Exception):
    """Base class of the registry's errors."""


class UnknownSparkJob(SparkJobError, LookupError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        known = sorted(known)
        hint = _jobs.did_you_mean(name, known)
        super().__init__(f"unknown Spark job {name!r}{hint}; registered jobs: {', '.join(known) or '(none)'}")


class SparkParamError(SparkJobError, ParamError):
    """Bad parameters for a job; `errors` maps each bad field to what is wrong with it."""

    def __init__(self, job: str, errors: Mapping[str, str]) -> None:
        self.job = job
        super().__init__(f"Spark job {job!r}", errors)


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
    # The datasets its runs write and read (queue_app/dataset_refs.py); a succeeded run records a materialization of
    # each produced partition in the transaction that marks it succeeded (datasets/spark_runs.py).
    produces: tuple[DatasetRef, ...] = ()
    consumes: tuple[DatasetRef, ...] = ()
    # A data-aware trigger (datasets/triggers.py): the job runs for a partition when these datasets' partition is
    # materialized (datasets/spark_triggers.py starts it in the recorder's transaction).
    on_update: OnUpdate | None = None
    # Backfill by data (datasets/materialize.py): up to `backfill_batch` partitions in one run, their keys given
    # comma-separated in the str parameter `partitions_param` (the partition parameter gets the first).
    backfill_batch: int = 1
    partitions_param: str | None = None

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        values, errors = validate_params(self.params, raw, owner="job")
        if not errors and self.check is not None:
            errors.update(self.check(values))
        if errors:
            raise SparkParamError(self.name, errors)
        return values

    def dump_params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """JSON-safe params (for the child's --params-json and the SparkRun row)."""
        return {p.name: p.dump(values[p.name]) for p in self.params if values.get(p.name) is not None}


def _origin(job: SparkJob) -> str:
    if job.func is None:
        return f"the {job.source} script {job.name!r}"
    return origin_of(job.func)


# The modules named by the `SPARK_JOB_MODULES` setting (the shipped pipelines by default), then every installed
# app's `spark_jobs` module, register the jobs in code and settings.
_jobs: Registry[SparkJob] = Registry("Spark job", app_module="spark_jobs", setting="SPARK_JOB_MODULES", origin=_origin)


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
    produces: Any = None,
    consumes: Any = None,
    on_update: Any = None,
    trigger_mode: str = "all",
    debounce: float = 0,
    backfill_batch: int = 1,
    partitions_param: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `func(spark, params) -> dict | JobResult` as the Spark job `name`. `produces` and `consumes`
    name datasets: a list of names, or {name: the parameter naming the partition} (dataset_refs.py).
    `on_update` (same shape) makes it run for a partition when those datasets' partition is materialized, with
    `trigger_mode` "all" (every one updated since its last run) or "any", and `debounce` seconds
    (datasets/triggers.py). `backfill_batch=N` lets a backfill by data give one run up to N partitions, listed
    comma-separated in its str parameter `partitions_param`."""
    params = tuple(params)
    outputs = dataset_refs(produces, what=f"Spark job {name!r}: produces")
    inputs = dataset_refs(consumes, what=f"Spark job {name!r}: consumes")
    trigger = on_update_of(on_update, mode=trigger_mode, debounce=debounce, what=f"Spark job {name!r}")
    names = [p.name for p in params]
    if len(names) != len(set(names)):
        raise ValueError(f"Spark job {name!r} declares a parameter twice: {names}")
    check_backfill(name, params, backfill_batch, partitions_param)

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
                produces=outputs,
                consumes=inputs,
                on_update=trigger,
                backfill_batch=backfill_batch,
                partitions_param=partitions_param,
            )
        )
        return func

    return register_func


def check_backfill(name: str, params: Iterable[Param], batch: Any, partitions_param: str | None) -> None:
    """ValueError on a bad backfill policy: a batch that is not a whole number from 1 to 1,000, or a batch over
    one without a declared str parameter to receive the list."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1000:
        raise ValueError(f"Spark job {name!r}: backfill_batch is a whole number from 1 to 1000, got {batch!r}")
    types = {p.name: p.type for p in params}
    if partitions_param is not None and types.get(partitions_param) != "str":
        raise ValueError(f"Spark job {name!r}: partitions_param {partitions_param!r} must be a declared str parameter")
    if batch > 1 and partitions_param is None:
        raise ValueError(f"Spark job {name!r}: backfill_batch > 1 needs partitions_param (the parameter with the list)")


def register(job: SparkJob) -> SparkJob:
    """Register `job` under its name; registering the same function (or script) again replaces it, another
    one under a taken name is refused."""
    return _jobs.register(job.name, job)


class JobSource:
    """Jobs kept outside the code (the admin's stored scripts): found by name, listed for the trigger form."""

    def find(self, name: str) -> SparkJob | None:  # pragma: no cover - interface
        raise NotImplementedError

    def jobs(self) -> list[SparkJob]:  # pragma: no cover - interface
        raise NotImplementedError


_sources: list[JobSource] = []


def add_source(source: JobSource) -> None:
    _sources.append(source)


def get_job(name: str) -> SparkJob:
    job = _jobs.get(name)
    for source in _sources if job is None else ():
        if (job := source.find(name)) is not None:
            break
    if job is None:
        raise UnknownSparkJob(name, [j.name for j in all_jobs()])
    return job


def code_job(name: str) -> SparkJob | None:
    """The job registered under `name` in code or settings (not a stored one)."""
    return _jobs.get(name)


def code_jobs() -> list[SparkJob]:
    """The jobs registered in code or settings (not the stored ones: no database read)."""
    return sorted(_jobs.entries().values(), key=lambda job: job.name)


def stored_jobs() -> list[SparkJob]:
    """The jobs of the other sources (stored scripts) whose names no code or settings job has taken."""
    return [job for source in _sources for job in source.jobs() if _jobs.get(job.name) is None]


def all_jobs() -> list[SparkJob]:
    jobs = _jobs.entries()
    for source in _sources:
        for job in source.jobs():
            jobs.setdefault(job.name, job)  # the code's registration wins (the admin refuses such a name)
    return sorted(jobs.values(), key=lambda job: job.name)


def validate(job_name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Typed parameters for `job_name` from raw values; raises SparkParamError listing every bad field."""
    return get_job(job_name).validate(raw)
