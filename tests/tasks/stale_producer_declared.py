"""Imported by the workers of tests/datasets/processes/test_datasets_stale_producer.py (`run_worker --import
tests.tasks.stale_producer_declared`): its dataset and producer task declared."""

from tests.tasks.stale_producer_tasks import declare

declare()
