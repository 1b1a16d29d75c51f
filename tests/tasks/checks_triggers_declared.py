"""Imported by the workers of tests/datasets/processes/test_datasets_checks_triggers_workers.py (`run_worker --import
tests.tasks.checks_triggers_declared`): its datasets, blocking check and trigger declared."""

from tests.tasks.checks_triggers_tasks import declare

declare()
