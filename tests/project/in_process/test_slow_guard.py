"""Tests that start real workers are marked slow (tests/support/slow_guard.py): pytest collects, in a child process, a
tiny suite using a worker-starting fixture with and without the marker, with the project's tests/conftest.py as
its plugin."""

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

TINY = textwrap.dedent(
    """
    import pytest

    @pytest.fixture
    def worker():
        return "a real worker would start here"

    def test_unmarked(worker):
        pass

    @pytest.mark.slow
    def test_marked_slow(worker):
        pass

    @pytest.mark.spark
    def test_marked_spark(worker):
        pass

    def test_starts_nothing():
        pass
    """
)


def _collect(tmp_path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:django", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*cmd, "--collect-only", "-q", "test_tiny.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_test_starting_a_worker_without_the_slow_marker_is_refused_by_name(tmp_path):
    done = _collect(tmp_path, TINY)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    refused = out.split("must be marked @pytest.mark.slow (or spark):", 1)[-1]
    assert refused != out and refused.split() == ["test_tiny.py::test_unmarked"], out  # that one, by name


def test_marked_tests_are_collected(tmp_path):
    done = _collect(tmp_path, TINY.replace("def test_unmarked", "@pytest.mark.slow\ndef test_unmarked"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "4 tests collected" in out, out


RUNS = textwrap.dedent(
    """
    import subprocess
    import sys

    import pytest

    # A child whose argv names manage.py and a worker command (it runs `python -c pass`: nothing starts).
    WORKER = [sys.executable, "-c", "pass", "manage.py", "run_worker", "--burst"]
    OTHER = [sys.executable, "-c", "pass", "manage.py", "queue_stats"]

    def test_unmarked_starts_a_worker():
        subprocess.run(WORKER, check=True)

    @pytest.mark.slow
    def test_marked_starts_a_worker():
        subprocess.run(WORKER, check=True)

    def test_unmarked_runs_another_command():
        subprocess.run(OTHER, check=True)
    """
)


def test_a_test_that_starts_a_worker_through_its_own_subprocess_unmarked_fails_naming_the_command(tmp_path):
    (tmp_path / "test_tiny.py").write_text(RUNS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:django", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*cmd, "-q", "-rf", "test_tiny.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "test_unmarked_starts_a_worker starts a real worker and must be marked @pytest.mark.slow" in out, out
    assert "manage.py run_worker --burst" in out, out
