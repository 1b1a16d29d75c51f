"""The documentation stays true to the code: the site builds with warnings as errors (a broken link, a missing
anchor, a renamed API or a command whose parser fails to render fails the build), every test the docs cite as
proof exists, every setting the code reads is documented, and the README's links lead somewhere.

This is CI's docs build: `.ci/run` runs `manage.py test`, which runs this file, so a docs break fails the run and
also fails a developer's local `manage.py test` (rather than only a CI-only step).
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from queue_app.conf import DEFAULTS
from tests.support.paths import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"
CITED_TEST = re.compile(r"tests/([\w/]+\.py)::(\w+)")
# Variables jobsite sets for its own children, and the benchmarks' and tests' knobs: listed on the settings page
# by family (`JOBSITE_BENCH_*`), not one by one.
FAMILIES = ("JOBSITE_BENCH_",)
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
JOBSITE_COMMANDS = sorted(p.stem for p in (ROOT / "queue_app" / "management" / "commands").glob("[a-z]*.py"))


def pages() -> dict[Path, str]:
    return {path: path.read_text() for path in [README, *DOCS.rglob("*.md")]}


def test_the_docs_build_with_warnings_as_errors(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # material's banner about MkDocs 2.0, not a docs problem
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    commands = (tmp_path / "site" / "reference" / "commands" / "index.html").read_text()
    assert "run_worker" in commands and "--concurrency" in commands  # the hook rendered the parsers
    assert "<!-- commands -->" not in commands


def test_the_site_fetches_nothing_from_elsewhere():
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s+font: false$", config, re.M), "theme.font must be false: no web fonts from a CDN"
    assert "extra_javascript" not in config and "extra_css" not in config


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_the_docs_cite_as_proof_exists():
    cited = {(file, name) for text in pages().values() for file, name in CITED_TEST.findall(text)}
    assert len(cited) > 30  # the guarantees page cites the tests that prove each guarantee
    missing = sorted(
        f"tests/{file}::{name}"
        for file, name in cited
        if not (ROOT / "tests" / file).exists() or name not in defined_tests(ROOT / "tests" / file)
    )
    assert missing == []


def string_literals(path: Path) -> list[str]:
    """The strings a module uses, its docstrings left out (they show example names, not ones the code reads)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_setting_the_code_reads_is_on_the_settings_page():
    page = (DOCS / "reference" / "settings.md").read_text()
    literals = [
        text for top in ("jobsite", "queue_app") for p in (ROOT / top).rglob("*.py") for text in string_literals(p)
    ]
    variables = {name for text in literals for name in re.findall(r"\b(JOBSITE_[A-Z][A-Z_]*[A-Z])\b", text)}
    assert {"JOBSITE_SPARK_CONNECT", "JOBSITE_NO_BOOTSTRAP"} <= variables
    # Every JOBSITE key is read from JOBSITE_<KEY> by queue_app.conf.from_env() (jobsite/settings.py calls it):
    # the page says so once, and lists each key (the last assert).
    assert "from_env()" in page
    undocumented = sorted(
        name
        for name in variables
        if not re.search(rf"\b{name}\b", page)
        and not name.startswith(FAMILIES)
        and name.removeprefix("JOBSITE_") not in DEFAULTS
    )
    assert undocumented == []
    assert sorted(key for key in DEFAULTS if f"`{key}`" not in page) == []


def test_the_readme_links_lead_to_files_that_exist_and_it_stays_a_landing_page():
    text = README.read_text()
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets)
    assert sorted(t for t in targets if not (ROOT / t).exists()) == []
    assert len(text.splitlines()) <= 300


def documented_invocations() -> list[tuple[str, str, list[str]]]:
    """(page, command, its --flags) for every `manage.py COMMAND ...` the docs and the README write out, a line
    continued with a backslash included."""
    found = []
    for path, text in pages().items():
        joined = text.replace("\\\n", " ")
        for line in joined.splitlines():
            for match in re.finditer(r"manage\.py (\w+)([^`|#\n]*)", line):
                found.append((path.name, match.group(1), FLAG.findall(match.group(2))))
            # `run_worker --pool thread` in prose: a code span that starts with one of jobsite's commands.
            for match in re.finditer(rf"`({'|'.join(JOBSITE_COMMANDS)}) ([^`]*)`", line):
                found.append((path.name, match.group(1), FLAG.findall(match.group(2))))
    return found


def command_options(name: str) -> set[str] | None:
    from django.core.management import get_commands, load_command_class

    app = get_commands().get(name)
    if app is None:
        return None
    parser = load_command_class(app, name).create_parser("manage.py", name)
    options = set()
    parsers = [parser]
    while parsers:
        current = parsers.pop()
        for action in current._actions:
            options.update(action.option_strings)
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                parsers.extend(action.choices.values())
    return options


def test_every_command_and_flag_the_docs_write_out_exists():
    invocations = documented_invocations()
    assert len(invocations) > 40
    wrong = []
    for page, name, flags in invocations:
        # test: every argument goes to pytest; help and version: Django's own, answered before any command loads
        if name in ("test", "help", "version"):
            continue
        options = command_options(name)
        if options is None:
            wrong.append(f"{page}: no command {name!r}")
            continue
        wrong += [f"{page}: {name} has no {flag}" for flag in flags if flag not in options]
    assert sorted(set(wrong)) == []
