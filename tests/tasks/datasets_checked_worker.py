"""Imported by the workers of tests/datasets/spark/test_datasets_checks.py: the checked dataset, its checks and its
consumer."""

from tests.tasks.datasets_checked import declare, declare_consumer

declare()
declare_consumer()
