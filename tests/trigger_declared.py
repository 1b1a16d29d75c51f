"""Imported by the workers of the trigger tests (`run_worker --import tests.trigger_declared`): the trigger
tasks with their datasets and consumers declared."""

from tests.trigger_tasks import declare

declare()
