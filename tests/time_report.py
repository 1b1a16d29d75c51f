"""Where the suite's time went, per group: a pytest plugin (installed by tests/conftest.py) that sums each test's
setup, call and teardown seconds by its tier (the first of its markers among spark, browser, slow; else
in-process) and prints the sums at the end, so a run that grew slow says which tier grew (`.ci/run` shows it)."""

from __future__ import annotations

from collections import defaultdict

import pytest

PLUGIN = "jobsite_time_report"
TIERS = ("spark", "browser", "slow")

_seconds: dict[str, float] = defaultdict(float)
_tests: dict[str, set[str]] = defaultdict(set)
_tier_of: dict[str, str] = {}


def tier(item: pytest.Item) -> str:
    return next((name for name in TIERS if item.get_closest_marker(name)), "in-process")


def pytest_collection_modifyitems(session, config, items) -> None:
    _tier_of.update({item.nodeid: tier(item) for item in items})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = _tier_of.get(report.nodeid, "in-process")
    _seconds[group] += report.duration
    _tests[group].add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _seconds:
        return
    terminalreporter.section("time per group (setup + call + teardown)")
    for group, seconds in sorted(_seconds.items(), key=lambda pair: -pair[1]):
        terminalreporter.write_line(f"{group:>12}: {seconds:8.1f} s  {len(_tests[group]):5d} tests")
