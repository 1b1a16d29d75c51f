"""System checks of the JOBSITE settings dict: unknown keys (a typo would silently be the default), values of the
wrong type, and a VAR_DIR that cannot be placed. Misconfiguration is a check error at start, not a crash at first
use (Django's own `tasks` checks are the model)."""

import difflib
from collections.abc import Mapping
from numbers import Real
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import DEFAULTS, var_dir


def _type_error(key: str, value: Any) -> str | None:
    default = DEFAULTS[key]
    if default is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int | float):
        return None if isinstance(value, Real) and not isinstance(value, bool) else "a number"
    if isinstance(default, tuple):
        return None if isinstance(value, list | tuple) else "a list or tuple"
    if isinstance(default, dict):
        return None if isinstance(value, Mapping) else "a dict"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    return None


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    user = getattr(settings, "JOBSITE", {})
    if user is None:
        user = {}
    if not isinstance(user, Mapping):
        return [checks.Error("settings.JOBSITE must be a dict.", id="jobsite.E020")]
    errors: list[checks.CheckMessage] = []
    for key, value in user.items():
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
            errors.append(
                checks.Error(
                    f"JOBSITE[{key!r}] is not a jobsite setting.",
                    hint=f"Did you mean {close[0]!r}?" if close else "See the settings reference for every key.",
                    id="jobsite.E021",
                )
            )
            continue
        wanted = _type_error(key, value)
        if wanted:
            errors.append(
                checks.Error(f"JOBSITE[{key!r}] must be {wanted}, not {type(value).__name__}.", id="jobsite.E022")
            )
    try:
        var_dir()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), hint='Set JOBSITE["VAR_DIR"] to a directory.', id="jobsite.E023"))
    return errors


def _missing(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return True
    return False


@checks.register(checks.Tags.compatibility)
def check_extras(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A feature switched on whose libraries are not installed: the error names the extra that brings them."""
    from .conf import queue_settings
    from .engine import tracing

    wanted = []
    if queue_settings.OPENLINEAGE and _missing("openlineage.client"):
        wanted.append(('JOBSITE["OPENLINEAGE"] is set', "datasets"))
    if tracing.wanted() and _missing("opentelemetry.sdk"):
        wanted.append(("OTEL_TRACES_EXPORTER asks for traces", "tracing"))
    return [
        checks.Error(
            f"{why} but its libraries are not installed.", hint=f"pip install 'jobsite[{extra}]'", id="jobsite.E024"
        )
        for why, extra in wanted
    ]
