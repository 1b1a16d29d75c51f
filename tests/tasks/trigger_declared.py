"""Imported by the workers of the trigger tests (`run_worker --import tests.tasks.trigger_declared`): the trigger
tasks with their datasets and consumers declared."""

from tests.tasks.trigger_tasks import declare

declare()
