"""Imported by the workers of tests/test_datasets_checks_triggers_workers.py (`run_worker --import
tests.checks_triggers_declared`): its datasets, blocking check and trigger declared."""

from tests.checks_triggers_tasks import declare

declare()
