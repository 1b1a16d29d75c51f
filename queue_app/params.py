"""Declared parameters, shared by Spark jobs (spark/registry.py) and workflows (workflows/definition.py).

A `Param` names one parameter, its type and bounds; `validate_params` turns raw input (a form's strings, JSON,
or typed values) into typed values and reports every bad field at once, before anything is queued. The child
process of a Spark run rebuilds the same typed values from the JSON `Param.dump` made. Plain Python: importable
without Django (the Spark child imports it).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

ParamType = Literal["int", "float", "str", "bool", "date", "choice", "path"]
PARAM_TYPES: tuple[str, ...] = ("int", "float", "str", "bool", "date", "choice", "path")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ParamError(ValueError):
    """Bad parameters; `errors` maps each bad field to what is wrong with it (`__all__`: the whole input)."""

    def __init__(self, owner: str, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        lines = "; ".join(f"{name}: {message}" for name, message in self.errors.items())
        super().__init__(f"invalid parameters for {owner}: {lines}")


@dataclass(frozen=True)
class Param:
    """One declared parameter of a Spark job or a workflow.

    `default` applies when the value is missing or an empty string (what an HTML form sends for an empty
    field; a callable default is called then); `choices` is required for type "choice"; `min`/`max` bound int
    and float; `must_exist` makes a "path" parameter check that the path exists when validated.
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


def validate_params(params: Iterable[Param], raw: Any, *, owner: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(typed values, {field: message}) for `raw` against the declared `params`; `owner` ("job", "workflow")
    names what takes them in the message for an unknown field. A missing or empty value takes the default
    (called when callable: e.g. today's date at each start)."""
    params = tuple(params)
    if not isinstance(raw, Mapping):
        return {}, {"__all__": f"parameters must be a mapping, got {type(raw).__name__}"}
    errors: dict[str, str] = {}
    values: dict[str, Any] = {}
    declared = {p.name for p in params}
    for name in raw:
        if name not in declared:
            errors[name] = f"unknown parameter (this {owner} takes: {', '.join(sorted(declared)) or 'none'})"
    for param in params:
        value = raw.get(param.name)
        if value is None or (isinstance(value, str) and value.strip() == ""):
            if param.required:
                errors[param.name] = "this parameter is required"
            else:
                values[param.name] = param.default() if callable(param.default) else param.default
            continue
        try:
            values[param.name] = param.coerce(value)
        except ValueError as exc:
            errors[param.name] = str(exc)
    return values, errors
