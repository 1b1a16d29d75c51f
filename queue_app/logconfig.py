"""`logging_config()`: a LOGGING dict for a project's settings, with jobsite's ids on every line.

    from queue_app.logconfig import logging_config
    LOGGING = logging_config("json")                   # or "plain" (the default), level="INFO"
    JOBSITE = {..., "LOG_FORMAT": "json"}              # the worker then reads the ids the JSON lines carry

One console handler on the root logger, through logcontext.ContextFilter (the item, task, attempt, queue, worker,
workflow and Spark run a line is about, and the trace ids when tracing is on). "json" writes one JSON object per
line (python-json-logger), "plain" a line for people. A project with its own LOGGING adds the filter
`{"()": "queue_app.logcontext.ContextFilter"}` to its handlers instead. Imports nothing of the app: settings
modules call it before Django is set up.
"""

from typing import Any

FORMATS = ("plain", "json")


def logging_config(format: str = "plain", level: str = "INFO") -> dict[str, Any]:
    if format not in FORMATS:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, not {format!r}.")
    config: dict[str, Any] = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": ["levelname", "name", "message"],
                "rename_fields": {"levelname": "level", "name": "logger"},
                "timestamp": "time",  # ISO 8601, UTC
            },
        },
        "filters": {"context": {"()": "queue_app.logcontext.ContextFilter"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": format, "filters": ["context"]},
        },
        "root": {"handlers": ["console"], "level": level},
        # Django's own "django" logger has a console handler of its own (bare messages, DEBUG only) and
        # propagates to the root's: each django.tasks line was printed twice. One handler, formatted, for all.
        "loggers": {
            "django": {"handlers": [], "level": "INFO", "propagate": True},
            "django.db.backends": {"level": "WARNING"},
            # httpx logs each request's URL at INFO: a webhook URL may carry a token (chat bridges put one in it).
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
        },
    }
    if format == "json":  # runserver's request lines too (Django gives them a plain handler of their own)
        config["loggers"]["django.server"] = {"handlers": [], "level": "INFO", "propagate": True}
    return config
