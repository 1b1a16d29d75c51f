"""`queue_settings`: jobsite's namespaced settings with defaults (the `JOBSITE` dict in Django settings).

Modelled on DRF's api_settings: read lazily, cached, and reloaded when a test overrides settings. The apps read
only this dict; `from_env()` is the environment layer a project may call from its settings to fill it from
`JOBSITE_<KEY>` variables (the jobsite project does), and `check_settings` (a system check) refuses unknown keys
and values of the wrong type.
"""

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    "DEFAULT_QUEUE": "default",
    # The database alias (a key of DATABASES) the queue's tables live on. Not "default": install the router
    # (DATABASE_ROUTERS = ["queue_app.routers.JobsiteRouter"]); an enqueue then joins a transaction on this alias
    # only (engine/alias.py).
    "DATABASE": "default",
    "DEFAULT_LEASE_TIMEOUT": 60.0,  # seconds a reservation stays valid without a heartbeat
    "DEFAULT_MAX_ATTEMPTS": 5,
    "DEDUP_WINDOW": 300.0,  # seconds; SQS FIFO's window
    "MAX_PAYLOAD_BYTES": 1_048_576,
    "MAX_PAYLOAD_DEPTH": 64,
    "BACKOFF_BASE": 1.0,  # first retry after about this many seconds
    "BACKOFF_MAX": 3600.0,
    "BACKOFF_JITTER": 0.2,  # +-20%
    "NOTIFY_CHANNEL": "jobsite_queue",
    "DEFAULT_RETENTION_DAYS": 7,
    # Seconds a finished item stays in the hot table before the worker's archiver moves it (with its
    # reservations) into the partitioned history (queue_app/engine/history.py).
    "ARCHIVE_AFTER": 60.0,
    # Seconds between the worker's id marks (queue_app/engine/marks.py): the admin's "created / reserved in the
    # last hour" filters read at most this long's ids before their window.
    "ID_MARK_EVERY": 10.0,
    # A worker whose heartbeat is older than this is not live: /healthz and the admin stop counting it, and
    # maintenance marks its row stopped.
    "WORKER_LOST_AFTER": 60.0,
    # The engine's statements are prepared on the server once per connection (see engine/db.py); off whatever
    # this says when CONNECTION_POOLER is "transaction".
    "PREPARED_STATEMENTS": True,
    # An idle worker offers a slot that the next plain enqueue of its queues (in a transaction of its own) takes,
    # writing its item already leased to that worker, which starts it from the notification: no lease round trip
    # on an idle queue's path (queue_app/engine/handoff.py). False: every item is queued ready and leased.
    "HANDOFF": True,
    # None, or "transaction": the database is reached through a connection pooler that pools by transaction
    # (PgBouncer's pool_mode = transaction, most managed poolers). Then nothing of jobsite's outlives a
    # transaction on a connection: no prepared statements, no session settings, no LISTEN on a pooled
    # connection (see LISTEN_DATABASE_URL); duties that span transactions are leader rows (engine/leaders.py).
    "CONNECTION_POOLER": None,
    # A database URL past the pooler (postgres://...) for the worker's LISTEN connection, the one connection that
    # needs a session. Unset behind a transaction pooler: the worker polls (run_worker --poll-interval).
    "LISTEN_DATABASE_URL": None,
    # Webhooks (queue_app/webhooks/): loopback, link-local and private targets are refused unless allowed (tests,
    # local development); an endpoint failing without a success for this many days is disabled.
    "WEBHOOKS_ALLOW_PRIVATE": False,
    "WEBHOOKS_DISABLE_AFTER_DAYS": 5.0,
    "WEBHOOKS_CONNECT_TIMEOUT": 5.0,
    "WEBHOOKS_READ_TIMEOUT": 15.0,
    # Seconds a delivery may run (its rate-limit slot wait, connect and read) before the worker stops it. Its
    # lease is this plus 2 s: a worker killed mid-delivery hands the delivery on once that long has passed.
    "WEBHOOKS_HARD_TIMEOUT": 60.0,
    # Modules that register Spark jobs when imported (besides every app's `spark_jobs` module).
    "SPARK_JOB_MODULES": ("queue_app.spark.pipelines", "queue_app.spark.scripts"),
    # Directories existing PySpark scripts may be run from (besides JOBSITE_SPARK_SCRIPT_ROOTS, colon-separated).
    "SPARK_SCRIPT_ROOTS": (),
    # Scripts registered by settings: {name: {"path": ..., "args": [...], "params": [{...}], "conf": {...}, ...}}.
    "SPARK_SCRIPTS": {},
    # Per-job run policies by job name, over what the job declares (queue_app/spark/policy.py).
    "SPARK_JOB_POLICIES": {},
    # Named Spark resource profiles a policy can pick, besides the built-in small, medium and large.
    "SPARK_RESOURCE_PROFILES": {},
    # Days a finished run's Spark event log is kept when its job's policy sets no keep_days (then the run's own
    # retention applies to both); the run row stays. None or 0: kept until the run is deleted.
    "SPARK_EVENT_LOG_KEEP_DAYS": 14,
    # Datasets (queue_app/datasets/): modules that declare datasets when imported (besides every app's
    # `datasets` module), datasets declared by settings ({name: {"location": ..., "partitioning": ...}}), and the
    # directories a dataset's path may lie under (besides JOBSITE_DATASET_ROOTS; both empty: settings.VAR_DIR).
    "DATASET_MODULES": (),
    "DATASETS": {},
    # Data checks and file-arrival watches declared in settings (datasets/quality.py, datasets/watches.py):
    # [{"dataset": "events", "function": "myapp.checks.has_rows", "severity": "error"}, {"dataset": ..., "schema":
    # "myapp.schemas.EVENTS"}] and [{"dataset": "events", "glob": "landing/{partition}/*.csv"}].
    "DATASET_CHECKS": (),
    "DATASET_WATCHES": (),
    "DATASET_ROOTS": (),
    # Seconds a consumer parked on a partition that is not usable waits before it checks again, should the
    # transaction that made the partition usable have missed it (datasets/checks_run.py): the safety net only.
    "DATASET_PARK_RECHECK": 600.0,
    # OpenLineage (queue_app/datasets/openlineage.py): None (off) or {"transport": {"type": "http"|"file"|
    # "console", ...}, "namespace": "jobsite", "dataset_namespace": "jobsite", "queue_size": 1000}.
    "OPENLINEAGE": None,
    # Autoscaling signals (queue_app/autoscaling.py): the suggested worker count drains a queue's ready and
    # in-flight items within this many seconds at the recent throughput per worker, and never exceeds the cap.
    "AUTOSCALE_TARGET_DRAIN_SECONDS": 60.0,
    "AUTOSCALE_MAX_WORKERS": 20,
    # Seconds a workflow event sent while no step waits for it is kept, to be matched by a wait created later.
    "WORKFLOW_EVENT_LOOKBACK": 86400.0,
    # Sources that may POST workflow events to /events/<source>/ (workflows/inbound.py), each with its Standard
    # Webhooks secrets (old and new while rotating) and optionally a timestamp tolerance in seconds (at most 300):
    # {"partner": {"secrets": ["whsec_..."], "tolerance": 300}}.
    "WORKFLOW_EVENT_SOURCES": {},
    # Where jobsite keeps files of its own: the datasets' default root and the Spark runs' event logs. None:
    # `var/` under the project's BASE_DIR (Django's startproject defines it); a project without BASE_DIR sets it.
    "VAR_DIR": None,
    # "json" when the project's log lines are JSON (queue_app/logconfig.py): the worker then leases the workflow
    # ids each line carries.
    "LOG_FORMAT": "plain",
    # A file path: the worker (and each pool child) appends its stage stamps there when it ends, kept in memory
    # until then (queue_app/stages.py), for the bench's split of the start latency. None: off, nothing
    # recorded (read once, at the worker's start).
    "STAGE_TIMES": None,
}


class QueueSettings:
    """A setting is read from Django's settings on first use and then kept as an instance attribute (as DRF
    does), so later reads are plain attribute lookups: the engine reads several per enqueue and per lease."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Invalid jobsite setting: {name!r}")
        from django.conf import settings

        user = getattr(settings, "JOBSITE", {}) or {}
        value = user.get(name, DEFAULTS[name])
        setattr(self, name, value)
        return value

    def reload(self) -> None:
        self.__dict__.clear()


queue_settings = QueueSettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBSITE":
        queue_settings.reload()


setting_changed.connect(_reload)


def var_dir() -> Path:
    """JOBSITE["VAR_DIR"], else `<BASE_DIR>/var`; ImproperlyConfigured when neither is set (also a system check)."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    configured = queue_settings.VAR_DIR or getattr(settings, "BASE_DIR", None) and Path(settings.BASE_DIR) / "var"
    if not configured:
        raise ImproperlyConfigured('JOBSITE["VAR_DIR"] is not set and the settings have no BASE_DIR to put var/ under.')
    return Path(configured).expanduser()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(key: str, raw: str) -> Any:
    """One `JOBSITE_<KEY>` value, read as its default's type: numbers, booleans, lists for tuples, JSON for dicts
    and for settings whose default is None (a plain string when it is not JSON)."""
    default = DEFAULTS[key]
    if isinstance(default, bool):
        if raw.strip().lower() not in _TRUE | _FALSE:
            raise ValueError(f"JOBSITE_{key}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")
        return raw.strip().lower() in _TRUE
    if isinstance(default, int | float):
        try:
            return type(default)(raw.strip())
        except ValueError:
            raise ValueError(
                f"JOBSITE_{key}={raw!r}: expected {'an integer' if isinstance(default, int) else 'a number'}"
            ) from None
    if isinstance(default, tuple):  # JSON, else comma-separated (module names) or colon-separated (paths)
        raw = raw.strip()
        if raw.startswith("["):
            return tuple(json.loads(raw))
        return tuple(part.strip() for part in raw.split("," if "," in raw else os.pathsep) if part.strip())
    if isinstance(default, dict):
        try:
            value = json.loads(raw)
        except ValueError:
            raise ValueError(f"JOBSITE_{key}: expected a JSON object") from None
        if not isinstance(value, dict):
            raise ValueError(f"JOBSITE_{key}: expected a JSON object")
        return value
    if default is None:
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def from_env(environ: Mapping[str, str] | None = None, *, prefix: str = "JOBSITE_") -> dict[str, Any]:
    """The JOBSITE settings that `JOBSITE_<KEY>` environment variables set, each read as its default's type.

    For a project's settings module: `JOBSITE = {**from_env(), "DEFAULT_QUEUE": "mail"}`. Variables that name no
    setting are ignored (other parts of jobsite read some `JOBSITE_*` variables of their own); a value that cannot
    be read as its setting's type raises ImproperlyConfigured naming the variable.
    """
    from django.core.exceptions import ImproperlyConfigured

    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for key in DEFAULTS:
        if prefix + key in environ:
            try:
                values[key] = _parse(key, environ[prefix + key])
            except ValueError as exc:
                raise ImproperlyConfigured(str(exc)) from None
    return values


def env_number(
    name: str,
    default: float,
    *,
    zero_allowed: bool = True,
    unit: str = "",
    expected: str | None = None,
    error: type[Exception] | None = None,
) -> float:
    """A numeric environment variable read apart from the JOBSITE dict (the Spark layer's, the test command's):
    `default` when unset or blank; a finite number >= 0 (> 0 unless `zero_allowed`), else `error`
    (ImproperlyConfigured by default) saying `<name>=<value>: expected <expected>`, by default "a number<unit>
    >= 0 (default <default>)"."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        if error is None:
            from django.core.exceptions import ImproperlyConfigured as error
        bound = ">= 0" if zero_allowed else "> 0"
        raise error(f"{name}={raw!r}: expected {expected or f'a number{unit} {bound} (default {default:g})'}")
    return value
