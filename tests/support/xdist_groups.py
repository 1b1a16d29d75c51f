"""Parallel groups: a pytest plugin (installed by tests/conftest.py) that gives every test an ``xdist_group``, so
`manage.py test` (``-n N --dist loadgroup``, pytest-xdist) runs the suite in N worker processes, each on a test
database of its own (pytest-django's ``test_<name>_gw0``, ``_gw1`` ...), while the tests that must not overlap stay
together on one of them.

The group of a test, the first that applies:

- ``spark``: every test marked ``spark``, so one JVM set runs at a time (the session's local SparkSession, the
  launched ``spark-submit`` runs and Spark Connect servers) and the session fixtures of tests/support/spark_fixtures.py
  start once;
- ``chaos``: the ``slow`` tests of a ``*chaos*`` module, each a chaos run that creates, migrates and loads a
  private cluster of its own: one at a time;
- ``browser``: every test marked ``browser``, so one headless Chromium runs at a time;
- ``slow:<module>``: a module's other ``slow`` tests (real worker processes), together so a module-scoped fixture
  starts once;
- ``<module>``: a module's in-process tests.

A test (or module, via ``pytestmark``) that carries an ``xdist_group`` mark of its own keeps it. A module's tests
run in their file's order on one worker, the order pytest-django sorted them in (database tests before
transactional ones).

xdist's own loadgroup learns a test's group from a suffix its worker appends to the node id, which pytest 9's
structured node ids ignore (pytest-dev/pytest-xdist#1386: the groups are silently lost). So the groups travel
another way: each worker writes its collection's ``{node id: group}`` to a file in a directory the controller gave
it, and the controller's scheduler (`GroupsFirst`) reads it.

The controller hands the groups out longest first: ``spark``, ``chaos``, the ``slow:`` groups, ``browser``, then
the in-process ones, each rank's larger groups first (`GroupsFirst`), so the long Spark group never starts last.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path, PurePath

import pytest

PLUGIN = "jobsite_xdist_groups"
GROUPS_DIR = "jobsite_groups_dir"  # the workerinput key: where each worker writes its collection's groups
RANKS = ("spark", "chaos", "slow:", "browser")  # the order the controller hands groups out in; the rest last


GROUPS_KEY = pytest.StashKey[str]()


def group(item: pytest.Item) -> str:
    """The xdist group of a test (see the module's docstring)."""
    if own := item.get_closest_marker("xdist_group"):
        return str(own.args[0] if own.args else own.kwargs.get("name", "default"))
    module = item.nodeid.split("::", 1)[0]
    if item.get_closest_marker("spark"):
        return "spark"
    if item.get_closest_marker("browser"):
        return "browser"
    if item.get_closest_marker("slow"):
        return "chaos" if "chaos" in PurePath(module).stem else f"slow:{module}"
    return module


def rank(scope: str) -> int:
    return next((n for n, prefix in enumerate(RANKS) if scope.startswith(prefix)), len(RANKS))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which would append "@<group>" to each node id
def pytest_collection_modifyitems(session, config, items) -> None:
    """Mark each test with its group; on an xdist worker, write the groups where the controller reads them."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group(item)))
    if folder := getattr(config, "workerinput", {}).get(GROUPS_DIR):
        groups = {item.nodeid: group(item) for item in items}
        path = Path(folder) / f"{config.workerinput['workerid']}.json"
        path.with_suffix(".tmp").write_text(json.dumps(groups))
        path.with_suffix(".tmp").replace(path)  # whole or absent, never half-written


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput") and config.getvalue("dist") == "loadgroup":
        config.stash[GROUPS_KEY] = tempfile.mkdtemp(prefix="jobsite-xdist-groups-")


def pytest_unconfigure(config) -> None:
    if folder := config.stash.get(GROUPS_KEY, None):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure_node(node) -> None:
    if folder := node.config.stash.get(GROUPS_KEY, None):
        node.workerinput[GROUPS_DIR] = folder


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist: xdist's own scheduler
    from xdist.scheduler import LoadGroupScheduling

    class GroupsFirst(LoadGroupScheduling):
        """xdist's loadgroup, with each test's group read from the workers' files (see the module's docstring),
        and the groups handed out by `rank` (then by size) instead of by size alone."""

        _ordered = False
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                folder = Path(config.stash[GROUPS_KEY])
                written = sorted(folder.glob("*.json"))  # every worker collected the same tests (xdist checks)
                self._groups = json.loads(written[0].read_text()) if written else {}
            return self._groups.get(nodeid) or super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                units = sorted(self.workqueue.items(), key=lambda unit: (rank(unit[0]), -len(unit[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
                self._ordered = True
            super()._assign_work_unit(node)

    return GroupsFirst(config, log)
