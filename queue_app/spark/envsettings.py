"""The Spark layer's numeric environment variables (JOBSITE_SPARK_MAX_TIMEOUT, JOBSITE_SPARK_STOP_GRACE,
JOBSITE_SPARK_STATUS_API_AFTER, JOBSITE_SPARK_PROGRESS_INTERVAL): read once, when the module that uses each is
imported, in the worker, the triggering process and the Spark child alike. A value that is not a number of
seconds in range stops that import with ImproperlyConfigured naming the variable, its value and what it takes,
instead of a bare ValueError from float()."""

from __future__ import annotations

import math
import os

from django.core.exceptions import ImproperlyConfigured


def seconds(name: str, default: float, *, zero_allowed: bool = False) -> float:
    """`name`'s value in seconds, `default` when it is unset or blank; finite and > 0 (>= 0 with zero_allowed)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        bound = ">= 0" if zero_allowed else "> 0"
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a number of seconds {bound} (default {default:g})")
    return value
