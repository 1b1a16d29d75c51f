"""Settings for the django-tasks-db peer's processes: its app and its database backend for `django.tasks`."""

from .peer_settings import *  # noqa: F403

INSTALLED_APPS = ["django_tasks_db"]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
