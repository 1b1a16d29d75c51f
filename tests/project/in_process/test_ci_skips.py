"""No test may skip in CI (tests/support/skip_guard.py): pytest runs, in a child process, a tiny suite that skips in
each way pytest can, with the project's tests/conftest.py as its plugin, once with CI=true and once without."""

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

TINY = textwrap.dedent(
    """
    import pytest

    def test_passes():
        assert True

    @pytest.mark.skip(reason="marked to skip")
    def test_marked():
        pass

    def test_skips_inside():
        pytest.skip("skipped from inside")

    def test_imports_or_skips():
        pytest.importorskip("no_such_module_for_jobsite")

    @pytest.mark.xfail(reason="an expected failure, not a skip", strict=True)
    def test_expected_failure():
        assert False
    """
)
SKIPPED_MODULE = 'import pytest\n\npytest.importorskip("another_missing_module")\n\n\ndef test_never():\n    pass\n'
SKIPPED = ("test_tiny.py::test_marked", "test_tiny.py::test_skips_inside", "test_tiny.py::test_imports_or_skips")


def _run(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "test_module_skips.py").write_text(SKIPPED_MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI", "DJANGO_"))}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    # -p tests.conftest: the project's own conftest (which installs the guard), as `manage.py test` loads it.
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:django", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*cmd, "test_tiny.py", "test_module_skips.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_under_ci_a_run_that_skipped_fails_and_names_every_skipped_test(tmp_path):
    done = _run(tmp_path, "true")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    for nodeid in SKIPPED:
        assert f"SKIPPED {nodeid}: " in out, out
    assert "SKIPPED test_module_skips.py: " in out and "another_missing_module" in out, out
    assert "test_expected_failure" not in out.split("skipped tests", 1)[1], out  # xfail is not a skip
    assert "no test may skip in CI" in out, out
    assert "1 passed" in out and "1 xfailed" in out, out


def test_outside_ci_skips_are_allowed_and_reported(tmp_path):
    done = _run(tmp_path, None)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for nodeid in SKIPPED:
        assert f"SKIPPED {nodeid}: " in out, out
    assert "allowed outside CI" in out, out


def test_ci_false_is_not_ci(tmp_path):
    done = _run(tmp_path, "false")
    assert done.returncode == 0, done.stdout + done.stderr


# -- a system package that does not install fails `manage.py test` under CI ------------------------------------


def _test_command_with_failing_apt(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    """`manage.py test` where java, chromium and dot are not on PATH and apt-get fails as it does without a
    network (exit 100): the one way to make a real install fail without breaking the machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text("#!/bin/sh\necho 'E: Unable to locate package (no network here)' >&2\nexit 100\n")
    apt.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    env.update(PATH=str(bin_dir), JOBSITE_NO_BOOTSTRAP="1", DJANGO_SETTINGS_MODULE="jobsite.settings")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as on CI's machine: the command turns caching back on for pytest
    env.pop("JOBSITE_NO_SYSTEM_PACKAGES", None)
    if ci is not None:
        env["CI"] = ci
    args = ["test", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/project/in_process/test_ci_skips.py"]
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_under_ci_a_failed_system_package_install_fails_the_test_command(tmp_path):
    done = _test_command_with_failing_apt(tmp_path, "true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "apt-get install openjdk-17-jre-headless" in done.stderr and "failed (exit 100)" in done.stderr
    assert "Unable to locate package" in done.stderr  # apt's own reason, shown
    assert "CI=true: missing system packages java (openjdk-17-jre-headless)" in done.stderr, done.stderr
    assert "collected" not in done.stdout  # pytest never started


def test_outside_ci_a_failed_install_still_runs_the_tests(tmp_path):
    # and pytest caches what it compiles although the command's own environment says not to: its rewrite of this
    # module, removed here, is written again by the run.
    cached = list((ROOT / "tests/project/in_process/__pycache__").glob("test_ci_skips.*-pytest-*.pyc"))
    for path in cached:
        path.unlink()
    done = _test_command_with_failing_apt(tmp_path, None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed (exit 100)" in done.stderr
    assert "test_outside_ci_a_failed_install_still_runs_the_tests" in done.stdout
    assert list((ROOT / "tests/project/in_process/__pycache__").glob("test_ci_skips.*-pytest-*.pyc"))
