"""JobsiteRouter: every model of queue_app (the queue, its history, workers, schedules) and of the layer apps
(jobsite_spark, jobsite_workflows, jobsite_datasets, jobsite_webhooks: their SQL joins the queue's tables) read,
written and migrated on the queue's alias (JOBSITE["DATABASE"]), and on no other.

    DATABASES = {"default": ..., "queue": ...}
    DATABASE_ROUTERS = ["queue_app.routers.JobsiteRouter"]
    JOBSITE = {"DATABASE": "queue"}

Other apps' models are left to the next router (None), but not migrated on the queue's alias when it is not
"default": `migrate --database queue` creates jobsite's tables and nothing else. A relation is allowed between
two of jobsite's rows only: a foreign key cannot cross databases.
"""

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .engine.alias import queue_db

APP_LABEL = "queue_app"
# The core's label and the layer apps' (their AppConfig labels; the router names them, it imports none of them).
APP_LABELS = frozenset({APP_LABEL, "jobsite_spark", "jobsite_workflows", "jobsite_datasets", "jobsite_webhooks"})


def _ours(model: Any) -> bool:
    return model._meta.app_label in APP_LABELS


class JobsiteRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return queue_db() if _ours(model) else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return queue_db() if _ours(model) else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        mine = _ours(type(obj1)), _ours(type(obj2))
        if any(mine):
            return all(mine)
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        if app_label in APP_LABELS:
            return db == queue_db()
        if db == queue_db() != DEFAULT_DB_ALIAS:
            return False  # the queue's own database holds the queue's tables only (a router before this one may differ)
        return None
