"""The README's tour and docs/getting-started.md's, command by command, as a user runs them in two terminals
(issue 50): `up` in the first, the rest in a second whose `export`s never reach the first.

- Cheap, always: every `python3 manage.py ...` line of the tours' fenced `sh` blocks parses with its command's
  own parser (a flag renamed or a required one missing fails here).
- The walk (marked slow and spark: it runs the Spark examples, a JVM each, and the demo workflow: minutes, not
  the ~60 s of the default budget): a worker started with the first terminal's environment only (the base
  environment plus the `export`s the docs say go before `up`), then each command of the second terminal in
  order, with the exports it made, each exiting 0.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest
from django.core.management import get_commands, load_command_class

from tests.support.paths import ROOT

TOURS = {"README.md": "## A five-minute tour", "docs/getting-started.md": "## A five-minute tour"}
FENCE = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
EXPORT = re.compile(r"export (\w+)=([^\s;]+)")


def tour_blocks(path: str) -> list[str]:
    text = (ROOT / path).read_text()
    start = text.index(TOURS[path])
    end = text.find("\n## ", start + 1)
    return FENCE.findall(text[start : end if end != -1 else None])


def lines_of(block: str) -> list[str]:
    """The block's lines, backslash continuations joined."""
    return block.replace("\\\n", " ").splitlines()


def steps(path: str) -> tuple[dict[str, str], list[tuple[dict[str, str], list[str]]]]:
    """(the first terminal's exports: those on a comment line that names `manage.py up`, [(the second terminal's
    exports so far, argv of a `python3 manage.py` command)])."""
    first: dict[str, str] = {}
    second: dict[str, str] = {}
    found = []
    for block in tour_blocks(path):
        for line in lines_of(block):
            code, _, comment = line.partition("#") if not line.lstrip().startswith("#") else ("", "", line)
            if "manage.py up" in comment:
                first.update(EXPORT.findall(comment))
            code = code.strip()
            if code.startswith("export "):
                second.update(EXPORT.findall(code))
            elif code.startswith("python3 manage.py "):
                found.append((dict(second), shlex.split(code)[2:]))
    return first, found


def expand(value: str) -> str:
    return value.replace("$PWD", str(ROOT))


@pytest.mark.parametrize("path", list(TOURS))
def test_every_tour_command_parses_with_its_commands_parser(path):
    _, found = steps(path)
    assert len(found) >= 5, found  # the tour was found
    for _, argv in found:
        name, *args = argv
        assert name != "up"
        parser = load_command_class(get_commands()[name], name).create_parser("manage.py", name)  # its app
        parser.parse_args(args)  # SystemExit (a usage error) fails the test with the command's message


def test_the_readmes_script_example_sets_the_roots_for_the_first_terminal_too():
    first, found = steps("README.md")
    script = [env for env, argv in found if "--script" in argv]
    assert script and "JOBSITE_SPARK_SCRIPT_ROOTS" in script[0]  # the second terminal's export
    assert "JOBSITE_SPARK_SCRIPT_ROOTS" in first  # and the worker's, before `up`


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", list(TOURS))
def test_the_tour_walks_in_two_terminals(path, spawn, test_db_name, tmp_path):
    from tests.conftest import child_env

    first, found = steps(path)
    log = (tmp_path / "worker.log").open("w")
    spawn("run_worker", "--poll-interval", "0.2", env={k: expand(v) for k, v in first.items()}, stdout=log)
    for exported, argv in found:
        env = child_env(test_db_name, **{k: expand(v) for k, v in exported.items()})
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert os.path.exists(tmp_path / "worker.log")
