"""Imported by the workers of tests/test_datasets_stale_producer.py (`run_worker --import
tests.stale_producer_declared`): its dataset and producer task declared."""

from tests.stale_producer_tasks import declare

declare()
