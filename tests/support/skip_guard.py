"""No test skips in CI: a pytest plugin (installed by tests/conftest.py, so `manage.py test` and plain pytest both
enforce it).

Every skip is collected, whatever raised it (`pytest.mark.skip`/`skipif`, `pytest.skip()`, `pytest.importorskip`,
a module skipped at collection). An expected failure (`xfail`) is not a skip. At the end of the run the skipped
tests are listed by name with their reasons; under `CI=true` (or 1/yes) a run that skipped anything fails (exit 1)
even when every other test passed. Outside CI skips stay allowed and are only reported.

With pytest-xdist the controller decides: the workers' reports reach it through the same hooks.
"""

from __future__ import annotations

import pytest

from jobsite.ci import in_ci

SECTION = "skipped tests"
PLUGIN = "jobsite_skip_guard"


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipGuard:
    def __init__(self) -> None:
        self.skipped: dict[str, str] = {}  # node id -> reason

    def _note(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.setdefault(report.nodeid, _reason(report))

    def pytest_runtest_logreport(self, report) -> None:
        self._note(report)

    def pytest_collectreport(self, report) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session) -> None:
        if self.skipped and in_ci() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.skipped:
            return
        fails = in_ci()
        terminalreporter.section(SECTION, sep="=", red=fails, yellow=not fails, bold=True)
        for nodeid, reason in sorted(self.skipped.items()):
            terminalreporter.line(f"SKIPPED {nodeid}: {reason}")
        if fails:
            terminalreporter.line(
                f"CI=true: {len(self.skipped)} test(s) skipped, and no test may skip in CI: this run fails.",
                red=True,
                bold=True,
            )
        else:
            terminalreporter.line(f"{len(self.skipped)} skipped (allowed outside CI; under CI=true this run fails)")


def install(config) -> None:
    """Register the guard once (from a `pytest_configure` hook). An xdist worker only reports; its controller
    decides."""
    if not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.register(SkipGuard(), PLUGIN)
