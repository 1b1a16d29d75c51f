"""The layout of tests/ (issue 49; docs/development.md): every test module in tests/<app>/<tier>/,
its tests' markers saying its folder's tier (the slowest among them: a `slow` test in in_process/ fails here),
helper modules in tests/support/ or tests/tasks/ and never named test_*, and no test module importing another test
module.

The markers are the ones pytest applies (pytestmark, decorators, conftest and plugins): a child pytest collects the
suite with a small plugin that writes each test's markers."""

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
APPS = ("core", "spark", "workflows", "datasets", "webhooks", "project")
TIERS = ("in_process", "processes", "spark", "browser")  # by cost, cheapest first: a module sits in its slowest
TIER_OF_MARKER = {"slow": "processes", "spark": "spark", "browser": "browser"}
HELPER_FOLDERS = ("support", "tasks")
TOP = {"__init__.py", "conftest.py", "django_suite", *APPS, *HELPER_FOLDERS}
PLUGIN = """
import os

def pytest_collection_finish(session):
    with open(os.environ["LAYOUT_MARKERS_OUT"], "w") as out:
        for item in session.items:
            marks = sorted({m.name for m in item.iter_markers()} & {"slow", "spark", "browser"})
            out.write(item.nodeid + "\\t" + ",".join(marks) + "\\n")
"""


def modules_of_tests() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "django_suite" not in p.relative_to(TESTS).parts)


def test_the_top_of_tests_holds_only_conftest_and_the_folders():
    extra = sorted(
        p.name for p in TESTS.iterdir() if p.name not in TOP and p.name != "__pycache__" and not p.name.startswith(".")
    )
    assert not extra, f"move these into tests/<app>/<tier>/, tests/support/ or tests/tasks/: {extra}"


def test_every_test_module_is_in_an_app_and_tier_folder():
    misplaced = [
        str(p.relative_to(ROOT))
        for p in modules_of_tests()
        if len(p.relative_to(TESTS).parts) != 3
        or p.relative_to(TESTS).parts[0] not in APPS
        or p.relative_to(TESTS).parts[1] not in TIERS
    ]
    assert not misplaced, f"not in tests/<app>/<tier>/ (app {APPS}, tier {TIERS}): {misplaced}"
    for app in APPS:
        for folder in [TESTS / app, *(p for p in (TESTS / app).iterdir() if p.is_dir() and p.name != "__pycache__")]:
            assert (folder / "__init__.py").is_file(), f"{folder.relative_to(ROOT)} is not a package"


def test_helpers_are_apart_from_test_modules_and_not_named_test():
    in_app_folders = [
        str(p.relative_to(ROOT))
        for app in APPS
        for p in (TESTS / app).rglob("*.py")
        if not p.name.startswith("test_") and p.name != "__init__.py"
    ]
    assert not in_app_folders, f"helper modules belong in tests/support/ or tests/tasks/: {in_app_folders}"
    named_test = [str(p.relative_to(ROOT)) for f in HELPER_FOLDERS for p in (TESTS / f).rglob("test_*.py")]
    assert not named_test, f"a helper module named test_* would be collected as tests: {named_test}"


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_test_module_imports_another_test_module():
    found = {
        str(p.relative_to(ROOT)): sorted(n for n in imported(p) if n.rpartition(".")[2].startswith("test_"))
        for p in modules_of_tests()
    }
    found = {path: names for path, names in found.items() if names}
    assert not found, f"what two test modules share goes to tests/support/: {found}"


def test_each_modules_markers_say_its_folders_tier(tmp_path):
    (tmp_path / "layout_markers.py").write_text(PLUGIN)
    out = tmp_path / "items.tsv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(LAYOUT_MARKERS_OUT=str(out), JOBSITE_NO_BOOTSTRAP="1", PYTHONPATH=str(tmp_path))
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "layout_markers", "-p", "no:cacheprovider"]
    done = subprocess.run([*cmd, "-p", "no:xdist"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tiers = defaultdict(set)
    for line in out.read_text().splitlines():
        nodeid, _, marks = line.partition("\t")
        path = nodeid.split("::", 1)[0]
        tiers[path].add(max((TIER_OF_MARKER[m] for m in marks.split(",") if m), key=TIERS.index, default="in_process"))
    assert len(tiers) >= len(modules_of_tests()) - 1  # every module collected (a module of no tests would show here)
    wrong = {
        path: f"in {Path(path).parts[2]}/, its slowest test is {max(found, key=TIERS.index)}"
        for path, found in tiers.items()
        if "django_suite" not in path and Path(path).parts[2] != max(found, key=TIERS.index)
    }
    assert not wrong, f"a module sits in the folder of its slowest test's tier ({TIERS}): {wrong}"
