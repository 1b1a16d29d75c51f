"""Every OS package a test needs is installed by `manage.py test` before the first test (jobsite/system_packages.py):
a test that installs its own package, or a benchmark part that looks for one, must not depend on another test
having installed it first. A fresh-clone run failed that way: the quick bench's pooler part found no PgBouncer
because the pooler tests, on the other worker, had not yet installed it."""

import re
from pathlib import Path

from jobsite import system_packages
from jobsite.management.commands.test import TEST_PACKAGES
from tests.support.paths import ROOT

ENSURED = re.compile(r"system_packages\.ensure\(\[([^\]]*)\]")
# What a module uses that needs a package without naming it to ensure(): (text, package).
USES = (("pgbouncer.start(", "pgbouncer"), ("pgbouncer_tool.start(", "pgbouncer"), ("spark-submit", "java"))


def needed_by(paths) -> dict[str, set[str]]:
    needs: dict[str, set[str]] = {}
    for path in paths:
        if path.name == Path(__file__).name:
            continue  # this module names what it looks for
        text = path.read_text()
        names = {name for group in ENSURED.findall(text) for name in re.findall(r'"(\w+)"', group)}
        names |= {package for used, package in USES if used in text}
        for name in names:
            needs.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return needs


def test_the_test_command_installs_every_package_a_test_or_a_bench_part_needs():
    needs = needed_by([*ROOT.glob("tests/**/*.py"), *ROOT.glob("jobsite/bench/*.py")])
    assert "pgbouncer" in needs and "java" in needs, needs  # the scan finds what it looks for
    # Redis is the one exception: .ci/run installs and starts a server when none answers (the bench's Celery peer).
    missing = {name: sorted(where) for name, where in needs.items() if name not in TEST_PACKAGES and name != "redis"}
    assert not missing, f"needed by tests but not installed by `manage.py test` first: {missing}"
    assert set(TEST_PACKAGES) <= set(system_packages.NEEDS)
