"""Where the suite's time went: a pytest plugin (installed by tests/conftest.py) that sums each test's setup, call
and teardown seconds by its tier (the first of its markers among spark, browser, slow; else in-process), by its
folder (`tests/<app>/<tier>/`: where an app's tests of a tier spend their time) and by its parallel group
(tests/support/xdist_groups.py), and prints the sums at the end, so a run that grew slow says which tier, folder
and group grew (`.ci/run` shows it).

Under pytest-xdist the sums are made on the controller, from the reports the workers send: each test's tier and
group travel in its report's ``user_properties`` (the controller collects nothing itself). A parallel run also
prints each worker's busy seconds beside the run's wall clock: how well the groups filled the workers.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

PLUGIN = "jobsite_time_report"
TIERS = ("spark", "browser", "slow")
TIER, GROUP = "jobsite_tier", "jobsite_group"  # the user_properties keys
GROUPS_SHOWN = 12  # the slowest groups listed; the rest summed on one line

_tiers: dict[str, list] = defaultdict(lambda: [0.0, set()])  # tier -> [seconds, node ids]
_groups: dict[str, list] = defaultdict(lambda: [0.0, set()])
_folders: dict[str, list] = defaultdict(lambda: [0.0, set()])
_workers: dict[str, float] = defaultdict(float)
_started = time.monotonic()


def folder(nodeid: str) -> str:
    """`core/processes` for tests/core/processes/test_x.py::test_y: the test's folder under tests/."""
    parts = nodeid.split("::", 1)[0].split("/")[:-1]
    return "/".join(parts[1:] if parts[:1] == ["tests"] else parts) or "."


def tier(item: pytest.Item) -> str:
    return next((name for name in TIERS if item.get_closest_marker(name)), "in-process")


@pytest.hookimpl(trylast=True)  # after tests/support/xdist_groups.py gave each test its group
def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        group = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) if mark else tier(item)
        item.user_properties += [(TIER, tier(item)), (GROUP, group)]


def pytest_sessionstart(session) -> None:
    global _started
    _started = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    tier_, group = props.get(TIER, "in-process"), props.get(GROUP, "?")
    for sums, key in ((_tiers, tier_), (_folders, folder(report.nodeid)), (_groups, group)):
        sums[key][0] += report.duration
        sums[key][1].add(report.nodeid)
    node = getattr(report, "node", None)  # the xdist worker that ran it (on the controller)
    if node is not None:
        _workers[node.workerinput["workerid"]] += report.duration


def _write_sums(terminalreporter, sums: dict[str, list], shown: int | None = None) -> None:
    ordered = sorted(sums.items(), key=lambda pair: -pair[1][0])
    for name, (seconds, tests) in ordered[:shown]:
        terminalreporter.write_line(f"{name:>40}: {seconds:8.1f} s  {len(tests):5d} tests")
    if shown is not None and (rest := ordered[shown:]):
        seconds, count = sum(s for _, (s, _t) in rest), sum(len(t) for _, (_s, t) in rest)
        terminalreporter.write_line(f"{f'{len(rest)} other groups':>40}: {seconds:8.1f} s  {count:5d} tests")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _tiers or hasattr(config, "workerinput"):
        return
    terminalreporter.section("time per tier (setup + call + teardown)")
    _write_sums(terminalreporter, _tiers)
    terminalreporter.section("time per folder (tests/<app>/<tier>/), slowest first")
    _write_sums(terminalreporter, _folders)
    if _workers:
        wall = time.monotonic() - _started
        terminalreporter.section("time per parallel group (tests/support/xdist_groups.py), slowest first")
        _write_sums(terminalreporter, _groups, GROUPS_SHOWN)
        busy = ", ".join(f"{worker} {seconds:.0f} s" for worker, seconds in sorted(_workers.items()))
        terminalreporter.write_line(f"wall clock {wall:.0f} s; busy per worker: {busy}")
