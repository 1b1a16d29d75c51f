"""The demo's tasks and workflows (the task and workflow registries import every installed app's tasks.py)."""

from . import pipeline, waits  # noqa: F401  register demo_pipeline, demo_waits and their tasks
