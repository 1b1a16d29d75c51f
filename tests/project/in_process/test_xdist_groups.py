"""The suite in parallel groups (tests/support/xdist_groups.py, `manage.py test`): pytest runs, in a child process, a
tiny suite with pytest-xdist and the project's tests/conftest.py as its plugin, and each test writes down the worker it
ran on; the tests of a group ran on one worker, and the time report names the groups. `manage.py test` passes
its parallelism to pytest unless told otherwise, and stops a run past its budget with a clear failure."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from jobsite.management.commands.test import parallel_args
from tests.conftest import ROOT
from tests.support import time_report
from tests.support.xdist_groups import RANKS, rank

RECORD = textwrap.dedent(
    """
    import os
    from pathlib import Path

    import pytest

    def ran(name):
        Path(os.environ["RAN_DIR"], name).write_text(os.environ.get("PYTEST_XDIST_WORKER", "main"))
    """
)
MODULES = {
    "test_a.py": """
        @pytest.mark.spark
        def test_spark_a(): ran("spark_a")

        @pytest.mark.browser
        def test_browser_a(): ran("browser_a")

        @pytest.mark.slow
        def test_slow_a1(): ran("slow_a1")

        @pytest.mark.slow
        def test_slow_a2(): ran("slow_a2")

        @pytest.mark.parametrize("n", range(4))
        def test_in_process_a(n): ran(f"in_process_a{n}")
        """,
    "test_b.py": """
        @pytest.mark.spark
        def test_spark_b1(): ran("spark_b1")

        @pytest.mark.spark
        def test_spark_b2(): ran("spark_b2")

        @pytest.mark.browser
        def test_browser_b(): ran("browser_b")

        @pytest.mark.xdist_group("own")
        def test_own_b(): ran("own_b")

        @pytest.mark.parametrize("n", range(4))
        def test_in_process_b(n): ran(f"in_process_b{n}")
        """,
    "test_c_chaos.py": """
        @pytest.mark.slow
        def test_chaos_c(): ran("chaos_c")

        @pytest.mark.xdist_group("own")
        def test_own_c(): ran("own_c")
        """,
    "test_d_chaos.py": """
        @pytest.mark.slow
        def test_chaos_d(): ran("chaos_d")
        """,
}


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory):
    """The tiny suite run with `-n 3 --dist loadgroup`: (its output, {test: the worker it ran on})."""
    where = tmp_path_factory.mktemp("tiny")
    ran = where / "ran"
    ran.mkdir()
    for name, body in MODULES.items():
        (where / name).write_text(RECORD + textwrap.dedent(body))
    (where / "pytest.ini").write_text("[pytest]\nmarkers =\n    spark\n    browser\n    slow\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI", "DJANGO_"))}
    env |= {"PYTHONPATH": str(ROOT), "RAN_DIR": str(ran)}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:django", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*cmd, "-n", "3", "--dist", "loadgroup", *MODULES],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out, {path.name: path.read_text() for path in ran.iterdir()}


def test_each_group_runs_on_one_worker_and_the_groups_spread_over_the_workers(parallel_run):
    out, worker_of = parallel_run
    assert len(worker_of) == 19, out  # every test ran, each once

    def workers(*names: str) -> set[str]:
        return {worker_of[name] for name in names}

    assert len(workers("spark_a", "spark_b1", "spark_b2")) == 1, worker_of  # across files: one JVM set at a time
    assert len(workers("browser_a", "browser_b")) == 1, worker_of
    assert len(workers("chaos_c", "chaos_d")) == 1, worker_of
    assert len(workers("slow_a1", "slow_a2")) == 1, worker_of  # a module's slow tests: its fixtures start once
    assert len(workers(*(f"in_process_a{n}" for n in range(4)))) == 1, worker_of
    assert len(workers("own_b", "own_c")) == 1, worker_of  # a group of its own, across files
    assert len(set(worker_of.values())) == 3, worker_of  # and the run used all three workers


def test_a_parallel_run_reports_its_time_per_tier_and_per_group(parallel_run):
    out, _ = parallel_run
    tiers = out.split("time per tier", 1)[1]
    assert " spark: " in tiers and "3 tests" in tiers, out  # summed on the controller, from the workers' reports
    folders = out.split("time per folder", 1)[1]
    assert " .: " in folders and " 19 tests" in folders, out  # the tiny suite's modules sit in one folder
    groups = out.split("time per parallel group", 1)[1]
    for group in ("spark", "browser", "chaos", "slow:test_a.py", "test_a.py", "own"):
        assert f" {group}: " in groups, out
    assert "busy per worker: gw0" in groups, out


def test_a_tests_folder_is_its_app_and_tier():
    assert time_report.folder("tests/core/processes/test_x.py::test_y[1]") == "core/processes"
    assert time_report.folder("tests/conftest.py::test_z") == "."
    assert time_report.folder("test_a.py::test_b") == "."


def test_the_long_groups_are_handed_out_first():
    ordered = sorted(["tests/test_x.py", "browser", "slow:tests/test_y.py", "chaos", "spark"], key=rank)
    assert ordered == ["spark", "chaos", "slow:tests/test_y.py", "browser", "tests/test_x.py"]
    assert RANKS[0] == "spark"


@pytest.mark.parametrize(
    ("args", "count", "added"),
    [
        ([], 3, ["-n", "3", "--dist", "loadgroup"]),
        (["-x", "-k", "lease"], 4, ["-n", "4", "--dist", "loadgroup"]),
        ([], 1, []),  # one worker: no xdist at all
        ([], 0, []),
        (["-n", "2"], 3, []),  # the caller chose
        (["-n2"], 3, []),
        (["--numprocesses=auto"], 3, []),
        (["--dist", "load"], 3, []),
        (["-p", "no:xdist"], 3, []),
        (["--collect-only", "-q"], 3, []),  # nothing to run in parallel
        (["--co"], 3, []),
    ],
)
def test_the_test_command_adds_its_parallelism_unless_the_arguments_choose(args, count, added):
    assert parallel_args(args, count) == added


def _test_command(tmp_path, *args: str, preexec_fn=None, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    environ |= {"JOBSITE_NO_BOOTSTRAP": "1", "JOBSITE_NO_SYSTEM_PACKAGES": "1", **env}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "test", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec_fn,
    )


def test_a_run_past_its_budget_is_stopped_reports_and_fails_saying_so(tmp_path):
    (tmp_path / "test_stuck.py").write_text(
        textwrap.dedent(
            """
            import threading

            def test_never_done():
                threading.Event().wait(120)  # set by nobody: the budget's stop ends it
            """
        )
    )
    done = _test_command(
        tmp_path,
        str(tmp_path / "test_stuck.py"),
        # Started as a shell starts a background job (`.ci/run &`, nohup): SIGINT ignored, which a child inherits.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        JOBSITE_TEST_WORKERS="0",
        JOBSITE_TEST_BUDGET_MINUTES="0.25",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "ran past its budget of 0.25 minutes (JOBSITE_TEST_BUDGET_MINUTES)" in out, out
    assert "KeyboardInterrupt" in out, out  # stopped as Ctrl-C stops it: pytest still wrote its report


def test_a_bad_worker_count_or_budget_is_a_clear_error(tmp_path):
    for name in ("JOBSITE_TEST_WORKERS", "JOBSITE_TEST_BUDGET_MINUTES"):
        done = _test_command(tmp_path, "--co", **{name: "many"})
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{name}='many': expected a number, 0 or more" in done.stderr
        assert "collected" not in done.stdout  # pytest never started
