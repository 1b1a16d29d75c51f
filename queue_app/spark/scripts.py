"""Existing PySpark applications as Spark jobs: a `.py` file (or a module) that spark-submit runs unmodified.

A script is registered by path with what spark-submit needs around it: `--py-files` dependencies, an argument
template whose `{name}` placeholders are the script's declared, validated parameters, Spark conf, environment,
driver/executor memory and cores. Three places register one, all through `script_job()`:

* code:     `register_script("wordcount", path="jobs/wordcount.py", args=["{input}"], params=[Param(...)])`
* settings: `JOBSITE = {"SPARK_SCRIPTS": {"wordcount": {"path": ..., "args": [...], "params": [{...}]}}}`
* admin:    the SparkScript model (models.py), edited by a user with its change permission.

And `spark_run --script PATH --arg VALUE` runs any script under the roots without registering it (the built-in
job `script`). Every path (the script's and each --py-files entry) must lie under an allowed root: the
colon-separated `JOBSITE_SPARK_SCRIPT_ROOTS` plus the `SPARK_SCRIPT_ROOTS` setting. Symlinks and `..` are
resolved before the check, and the resolved path is what spark-submit gets, so a link swapped later does not
move the run outside the roots. The script knows nothing of jobsite: its progress, app id, metrics and cancel
come from the driver's status REST API and its event log (launcher.py, eventlog.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from queue_app.conf import queue_settings
from queue_app.dataset_refs import DatasetError, DatasetRef, OnUpdate, dataset_refs, on_update_of, ref_problems
from queue_app.spark.policy import PolicyError, SparkPolicy
from queue_app.spark.registry import JobSource, Param, SparkJob, SparkJobError, SparkParamError, add_source, register

logger = logging.getLogger("jobsite.spark")
ROOTS_ENV = "JOBSITE_SPARK_SCRIPT_ROOTS"
ADHOC_JOB = "script"
MAX_ARGS = 200
MAX_ARG_CHARS = 4096
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_MEMORY = re.compile(r"^[1-9][0-9]{0,6}[kmgt]?$", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The launcher sets these for every run (which Spark and Python run it); a script may not move them.
RESERVED_ENV = {"SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR", "JAVA_HOME"}
RESERVED_CONF = {"spark.ui.port", "spark.ui.enabled", "spark.eventLog.dir", "spark.eventLog.enabled", "spark.app.name"}


class ScriptError(SparkJobError, ValueError):
    """A script's declaration or path is not acceptable; the message says why."""


def allowed_roots() -> list[str]:
    """Real paths of the roots scripts may live under (roots that do not exist are left out)."""
    raw = [p for p in os.environ.get(ROOTS_ENV, "").split(":") if p.strip()]
    raw += [str(p) for p in queue_settings.SPARK_SCRIPT_ROOTS]
    roots = []
    for path in raw:
        real = os.path.realpath(os.path.expanduser(path.strip()))
        if os.path.isdir(real) and real not in roots:
            roots.append(real)
    return roots


def _under(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def resolve_path(path: str, *, what: str = "script", suffixes: tuple[str, ...] = (".py",)) -> str:
    """The real path of `path` (a file, or for a script also a dotted module name found under a root) if it is a
    file under an allowed root with one of `suffixes`; ScriptError saying why not otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise ScriptError(f"the {what} path is empty")
    if "\0" in path or len(path) > 4096:
        raise ScriptError(f"the {what} path is not a usable path")
    roots = allowed_roots()
    if not roots:
        raise ScriptError(
            f"no script roots are allowed in this process, so no {what} can run: set {ROOTS_ENV} "
            "(colon-separated directories) or the SPARK_SCRIPT_ROOTS setting, in the environment of the process "
            "that triggers the run and of the worker that runs it (export it before `manage.py up` or run_worker)"
        )
    if what == "script" and _MODULE.match(path) and not path.endswith(".py"):
        relative = path.replace(".", os.sep)
        for root in roots:
            for candidate in (f"{relative}.py", os.path.join(relative, "__main__.py")):
                real = os.path.realpath(os.path.join(root, candidate))
                if _under(real, root) and os.path.isfile(real):
                    return real
        raise ScriptError(f"module {path!r} is not found under the allowed script roots ({':'.join(roots)})")
    real = os.path.realpath(os.path.expanduser(path))
    if not any(_under(real, root) for root in roots):
        raise ScriptError(
            f"{what} {path} (resolved: {real}) is outside the allowed script roots ({':'.join(roots)}); "
            f"add its directory to {ROOTS_ENV}"
        )
    if not os.path.isfile(real):
        raise ScriptError(f"{what} {real} does not exist or is not a file")
    if not real.endswith(suffixes):
        raise ScriptError(f"{what} {real} must end with {' or '.join(suffixes)}")
    return real


@dataclass(frozen=True)
class ScriptSpec:
    """How spark-submit runs one script. `path` None: the path and arguments come from the run's params (the
    ad-hoc `script` job of `spark_run --script`)."""

    path: str | None
    args: tuple[str, ...] = ()
    py_files: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    driver_memory: str = ""
    executor_memory: str = ""
    driver_cores: int | None = None
    executor_cores: int | None = None

    def bind(self, values: Mapping[str, Any], params: Sequence[Param]) -> BoundScript:
        """The real paths and the rendered arguments of one run (`values` validated); ScriptError if a path
        left the roots since."""
        if self.path is None:
            path, args = values["path"], parse_args_json(values.get("args") or "[]")
        else:
            dumped = {p.name: p.dump(values.get(p.name)) for p in params}
            path, args = self.path, [render_arg(a, dumped) for a in self.args]
        return BoundScript(
            path=resolve_path(path),
            args=tuple(args),
            py_files=tuple(
                resolve_path(p, what="--py-files entry", suffixes=(".py", ".zip", ".egg")) for p in self.py_files
            ),
            spec=self,
        )


@dataclass(frozen=True)
class BoundScript:
    path: str
    args: tuple[str, ...]
    py_files: tuple[str, ...]
    spec: ScriptSpec

    def submit_options(self) -> list[str]:
        """spark-submit options before the script path."""
        spec, options = self.spec, []
        for flag, value in (
            ("--driver-memory", spec.driver_memory),
            ("--executor-memory", spec.executor_memory),
            ("--driver-cores", spec.driver_cores),
            ("--executor-cores", spec.executor_cores),
        ):
            if value:
                options += [flag, str(value)]
        if self.py_files:
            options += ["--py-files", ",".join(self.py_files)]
        return options


def render_arg(template: str, values: Mapping[str, Any]) -> str:
    """`{name}` -> the parameter's value (empty when unset), `{{`/`}}` -> a brace. Nothing else is evaluated
    (no attribute or index access, unlike str.format)."""

    def sub(match: re.Match) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        value = values.get(match.group(1))
        return "" if value is None else (json.dumps(value) if isinstance(value, bool) else str(value))

    return _PLACEHOLDER.sub(sub, template)


def placeholders(template: str) -> list[str]:
    names = []
    for match in _PLACEHOLDER.finditer(template):
        if match.group(0) in ("{", "}"):
            raise ScriptError(f"argument {template!r}: a lone brace (write {{{{ or }}}} for a literal one)")
        if match.group(1):
            names.append(match.group(1))
    return names


def check_args(args: Iterable[Any]) -> list[str]:
    args = list(args)
    if len(args) > MAX_ARGS:
        raise ScriptError(f"at most {MAX_ARGS} arguments")
    for arg in args:
        if not isinstance(arg, str):
            raise ScriptError(f"every argument must be a string, got {type(arg).__name__}")
        if "\0" in arg or len(arg) > MAX_ARG_CHARS:
            raise ScriptError(f"argument {arg[:40]!r}: no NUL bytes, at most {MAX_ARG_CHARS} characters")
    return args


def parse_args_json(text: str) -> list[str]:
    try:
        args = json.loads(text)
    except ValueError:
        raise ScriptError("args must be a JSON list of strings") from None
    if not isinstance(args, list):
        raise ScriptError("args must be a JSON list of strings")
    return check_args(args)


def check_conf(conf: Mapping[str, Any]) -> dict[str, str]:
    if not isinstance(conf, Mapping):
        raise ScriptError("conf must be a mapping of Spark properties")
    checked = {}
    for key, value in conf.items():
        if not isinstance(key, str) or not key.startswith("spark.") or any(c in key for c in "\0\n= "):
            raise ScriptError(f"conf key {key!r}: a Spark property name starting with 'spark.'")
        if key in RESERVED_CONF:
            raise ScriptError(f"conf key {key!r} is set by jobsite for every run")
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        if "\0" in text or "\n" in text:
            raise ScriptError(f"conf {key}: no NUL or newline in the value")
        checked[key] = text
    return checked


def check_env(env: Mapping[str, Any]) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise ScriptError("env must be a mapping of variable names to values")
    checked = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ScriptError(f"env name {key!r} is not a variable name")
        if key in RESERVED_ENV or key.startswith("LD_"):
            raise ScriptError(f"env {key} is set by jobsite (or the loader) and cannot be overridden")
        if not isinstance(value, str) or "\0" in value:
            raise ScriptError(f"env {key}: the value must be a string without NUL bytes")
        checked[key] = value
    return checked


def _memory(what: str, value: Any) -> str:
    value = (value or "").strip() if isinstance(value, str) else value
    if value in ("", None):
        return ""
    if not isinstance(value, str) or not _MEMORY.match(value):
        raise ScriptError(f"{what} must look like 512m or 2g, got {value!r}")
    return value.lower()


def _cores(what: str, value: Any) -> int | None:
    if value in ("", None):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
        raise ScriptError(f"{what} must be a whole number from 1 to 256, got {value!r}")
    return value


def param_from_dict(raw: Mapping[str, Any]) -> Param:
    """A Param from its JSON form (settings, the admin); ScriptError naming what is wrong."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not _ENV_NAME.match(raw["name"]):
        raise ScriptError(f"a parameter needs a name made of letters, digits and _: {raw!r}")
    known = {"name", "type", "required", "default", "help", "choices", "min", "max", "must_exist"}
    if unknown := set(raw) - known:
        raise ScriptError(f"parameter {raw['name']!r}: unknown keys {', '.join(sorted(unknown))}")
    try:
        return Param(**{**raw, "choices": tuple(raw.get("choices") or ())})
    except (TypeError, ValueError) as exc:
        raise ScriptError(str(exc)) from None


def script_job(
    name: str,
    *,
    path: str,
    args: Iterable[str] = (),
    params: Iterable[Param | Mapping[str, Any]] = (),
    py_files: Iterable[str] = (),
    conf: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    driver_memory: str = "",
    executor_memory: str = "",
    driver_cores: int | None = None,
    executor_cores: int | None = None,
    description: str = "",
    source: str = "code",
    policy: SparkPolicy | Mapping[str, Any] | None = None,
    produces: Any = None,
    consumes: Any = None,
    on_update: Any = None,
    trigger_mode: str = "all",
    debounce: float = 0,
) -> SparkJob:
    """A SparkJob that runs the script at `path`; ScriptError (a ValueError) on any bad part of the declaration.
    The paths are checked against the roots when a run is triggered (its validation) and again at launch, not
    here: a declaration in code or settings must not stop Django from starting on a machine without roots."""
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_.-]{1,100}$", name):
        raise ScriptError(f"a script's name is 1-100 letters, digits, '.', '_' or '-': {name!r}")
    declared = tuple(p if isinstance(p, Param) else param_from_dict(p) for p in params)
    names = [p.name for p in declared]
    if len(names) != len(set(names)):
        raise ScriptError(f"a parameter is declared twice: {names}")
    args = tuple(check_args(args))
    for arg in args:
        if missing := [n for n in placeholders(arg) if n not in names]:
            raise ScriptError(f"argument {arg!r} names undeclared parameters: {', '.join(missing)}")
    spec = ScriptSpec(
        path=path,
        args=args,
        py_files=tuple(py_files),
        env=check_env(env or {}),
        driver_memory=_memory("driver memory", driver_memory),
        executor_memory=_memory("executor memory", executor_memory),
        driver_cores=_cores("driver cores", driver_cores),
        executor_cores=_cores("executor cores", executor_cores),
    )

    def check(values: Mapping[str, Any]) -> dict[str, str]:
        try:
            spec.bind(values, declared)
        except ScriptError as exc:
            return {"__all__": str(exc)}
        return {}

    return SparkJob(
        name=name,
        func=None,
        params=declared,
        description=description or f"PySpark script {path}",
        conf=check_conf(conf or {}),
        check=check,
        script=spec,
        source=source,
        policy=policy if isinstance(policy, SparkPolicy) or policy is None else _policy(policy),
        produces=_refs(produces, "produces"),
        consumes=_refs(consumes, "consumes"),
        on_update=_trigger(name, on_update, trigger_mode, debounce),
    )


def _trigger(name: str, on_update: Any, mode: Any, debounce: Any) -> OnUpdate | None:
    try:
        return on_update_of(on_update, mode=mode, debounce=debounce, what=f"script {name!r}")
    except DatasetError as exc:
        raise ScriptError(str(exc)) from None


def _refs(value: Any, what: str) -> tuple[DatasetRef, ...]:
    try:
        return dataset_refs(value, what=what)
    except DatasetError as exc:
        raise ScriptError(str(exc)) from None


def _policy(raw: Any) -> SparkPolicy:
    try:
        return SparkPolicy.from_mapping(raw)
    except (PolicyError, TypeError) as exc:
        raise ScriptError(f"policy: {exc}") from None


def register_script(name: str, **options: Any) -> SparkJob:
    """Register an existing PySpark script as the Spark job `name` (see script_job for the options)."""
    return register(script_job(name, **options))


def _check_adhoc(values: Mapping[str, Any]) -> dict[str, str]:
    errors = {}
    try:
        parse_args_json(values.get("args") or "[]")
    except ScriptError as exc:
        errors["args"] = str(exc)
    try:
        resolve_path(values["path"])
    except ScriptError as exc:
        errors["path"] = str(exc)
    return errors


ADHOC_SPEC = ScriptSpec(path=None)
register(
    SparkJob(
        name=ADHOC_JOB,
        func=None,
        params=(
            Param("path", "str", required=True, help="The PySpark script (under an allowed root)."),
            Param("args", "str", default="[]", help="Its arguments, a JSON list of strings."),
        ),
        description="Any PySpark script under the allowed roots, by path (manage.py spark_run --script PATH).",
        check=_check_adhoc,
        script=ADHOC_SPEC,
    )
)


def _register_settings_scripts() -> None:
    scripts = queue_settings.SPARK_SCRIPTS
    if not isinstance(scripts, Mapping):
        raise ScriptError("the SPARK_SCRIPTS setting must map names to script declarations")
    for name, options in scripts.items():
        try:
            register(script_job(name, source="settings", **dict(options)))
        except (TypeError, ScriptError) as exc:
            raise ScriptError(f"SPARK_SCRIPTS[{name!r}]: {exc}") from None


def stored_job(row: Any) -> SparkJob:
    """A SparkScript row as a SparkJob (ScriptError when a part of it is not acceptable)."""
    return script_job(
        row.name,
        path=row.path,
        args=row.args or [],
        params=row.params or [],
        py_files=row.py_files or [],
        conf=row.conf or {},
        env=row.env or {},
        driver_memory=row.driver_memory,
        executor_memory=row.executor_memory,
        driver_cores=row.driver_cores,
        executor_cores=row.executor_cores,
        description=row.description,
        source="admin",
        policy=row.policy or None,
        produces=row.produces or None,
        consumes=row.consumes or None,
    )


class StoredScripts(JobSource):
    """The SparkScript rows the admin edits (enabled ones), read on every lookup: an edit applies at once."""

    def find(self, name: str) -> SparkJob | None:
        from queue_app.spark.models import SparkScript

        row = SparkScript.objects.filter(name=name, enabled=True).first()
        if row is None:
            return None
        try:
            return stored_job(row)
        except ScriptError as exc:  # saved before a rule changed: say why it cannot run
            raise SparkParamError(name, {"__all__": str(exc)}) from None

    def jobs(self) -> list[SparkJob]:
        from queue_app.spark.models import SparkScript

        jobs = []
        for row in SparkScript.objects.filter(enabled=True).order_by("name"):
            try:
                jobs.append(stored_job(row))
            except ScriptError:  # its path left the roots since it was saved: not offered; a trigger says why
                continue
        return jobs


def check_stored(row: Any) -> dict[str, str]:
    """{field: message} for every unacceptable part of a SparkScript row (the admin shows them per field)."""
    from queue_app.spark.registry import code_job

    errors: dict[str, str] = {}
    if code_job(row.name) is not None:
        errors["name"] = f"{row.name!r} is a Spark job registered in code or settings; choose another name"
    checks = {
        "path": lambda: resolve_path(row.path),
        "py_files": lambda: [
            resolve_path(p, what="--py-files entry", suffixes=(".py", ".zip", ".egg"))
            for p in _string_list(row.py_files, "py_files")
        ],
        "conf": lambda: check_conf(row.conf or {}),
        "env": lambda: check_env(row.env or {}),
        "driver_memory": lambda: _memory("driver memory", row.driver_memory),
        "executor_memory": lambda: _memory("executor memory", row.executor_memory),
        "params": lambda: [param_from_dict(p) for p in _list(row.params, "params")],
        "args": lambda: check_args(_list(row.args, "args")),
        "policy": lambda: _policy(row.policy or {}),
        "produces": lambda: _check_refs(row, "produces"),
        "consumes": lambda: _check_refs(row, "consumes"),
    }
    for name, check in checks.items():
        try:
            check()
        except ScriptError as exc:
            errors[name] = str(exc)
    if not errors:
        try:
            stored_job(row)
        except ScriptError as exc:  # across fields: a placeholder naming no declared param
            errors["args"] = str(exc)
    return errors


def _check_refs(row: Any, what: str) -> None:
    """A stored script's produces/consumes: their shape, and the datasets and params they name (what the system
    check jobsite.E106 says of jobs in code, said here when the row is saved)."""
    refs = _refs(getattr(row, what) or None, what)
    params = [p.get("name") for p in row.params if isinstance(p, Mapping)] if isinstance(row.params, list) else []
    if problems := ref_problems(refs, params, produced=what == "produces"):
        raise ScriptError("; ".join(problems))


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise ScriptError(f"{what} must be a JSON list")
    return value


def _string_list(value: Any, what: str) -> list[str]:
    items = _list(value, what)
    if not all(isinstance(v, str) for v in items):
        raise ScriptError(f"{what} must be a JSON list of strings")
    return items


def save_script(row: Any, *, actor: str) -> Any:
    """Create or change a stored SparkScript (the admin's one way to write it); ScriptError listing every bad
    field writes nothing."""
    if errors := check_stored(row):
        raise SparkParamError(row.name or "(new script)", errors)
    row.updated_by = (actor or "")[:150]
    row.save()
    return row


def delete_script(row: Any, *, actor: str) -> None:
    """Delete a stored SparkScript (its runs stay, with their job name; a re-run says the job is gone)."""
    logger.info("spark script %s deleted by %s", row.name, actor or "?")
    row.delete()


_register_settings_scripts()
add_source(StoredScripts())

__all__ = ["ScriptError", "SparkParamError", "allowed_roots", "register_script", "resolve_path", "script_job"]
