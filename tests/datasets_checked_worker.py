"""Imported by the workers of tests/test_datasets_checks.py: the checked dataset, its checks and its consumer."""

from tests.datasets_checked import declare, declare_consumer

declare()
declare_consumer()
