"""``manage.py test [pytest args...]``: run the test suite with pytest (replaces Django's test runner).

Everything after ``test`` goes to pytest untouched (``-x``, ``-k expr``, ``-m "not spark"``, paths, node ids).
With ``JOBSITE_TEST_WORKERS=N`` (N > 0) the tests run in parallel: pytest-xdist's ``-n N --dist loadgroup``, N
worker processes each on a test database of its own, the tests that must not overlap (Spark, chaos runs, the
browser) kept together by tests/support/xdist_groups.py. The default is ``0``, one process; ``.ci/run`` sets 2,
which on CI's 2-core machine takes about half of the serial run's time (docs/development.md › In parallel).
Arguments that choose the parallelism themselves (``-n``/``--numprocesses``, ``--dist``, ``-p no:xdist``) are
left alone.

A run longer than ``JOBSITE_TEST_BUDGET_MINUTES`` (default 84; ``0``: no limit) is stopped at that mark like a
Ctrl-C (pytest still prints its report, where the time went included) and fails, saying so: a suite that grew
slow is found by the change that made it slow, not by CI's time limit.

pytest and what it starts run with bytecode caching on, whatever ``PYTHONDONTWRITEBYTECODE`` says (CI's machine
sets it): the suite starts hundreds of Python processes (workers, ``manage.py`` children, Spark drivers), and
without the ``__pycache__`` files each compiled every module of the project it imports again (about 0.3 s of CPU a
process, 1.07 s against 0.77 s for ``manage.py version``), and each pytest process rewrote every test module's
asserts again (14.5 s of CPU against 4.4 s to collect the suite). They are written where Python writes them,
beside the sources, which git ignores.

pytest's exit code becomes the command's; "no tests collected" (pytest's 5) counts as a failure. Under
``CI=true`` a system package that is missing after the install attempt fails the run at once (exit 1, naming it):
the tests that need it would only skip, and no test may skip in CI (tests/support/skip_guard.py).
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobsite import system_packages
from jobsite.ci import in_ci
from queue_app.conf import env_number

NO_TESTS_COLLECTED = 5
BUDGET_MINUTES = 84  # JOBSITE_TEST_BUDGET_MINUTES' default: inside CI's 90 minutes with the bootstrap
REPORT_GRACE = 300  # seconds pytest gets, once stopped at the budget, to finish its tests' teardown and report
TEST_PACKAGES = ["java", "jdbc", "chromium", "graphviz", "pgbouncer"]  # installed before the first test
# Arguments that choose the parallelism themselves, or make it pointless (a collection only).
NUMBER = "a number, 0 or more"  # what JOBSITE_TEST_WORKERS and _BUDGET_MINUTES take
PARALLEL_ARGS = ("-n", "--numprocesses", "--dist", "no:xdist", "-pno:xdist", "--collect-only", "--co")


def parallel_args(args: list[str], workers: int) -> list[str]:
    """pytest-xdist's arguments for `workers` processes, unless `args` choose the parallelism themselves."""
    if workers < 2 or any(arg.split("=", 1)[0] in PARALLEL_ARGS or arg.startswith("-n") for arg in args):
        return []
    return ["-n", str(workers), "--dist", "loadgroup"]


def _default_sigint() -> None:
    """In the pytest child, before it runs: SIGINT as Python's start expects it to find it (not ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command(BaseCommand):
    help = "Run the tests with pytest; all arguments are passed to pytest (see `manage.py test --help`)."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="arguments for pytest")

    def run_from_argv(self, argv):
        # Bypass Django's option parsing: pytest owns every option (-v, -x, -k ...). --settings/--pythonpath
        # were already applied by manage.py (DJANGO_SETTINGS_MODULE is in the environment pytest inherits).
        args = []
        skip_next = False
        for arg in argv[2:]:
            if skip_next:
                skip_next = False
                continue
            if arg in ("--settings", "--pythonpath"):
                skip_next = True
                continue
            if arg.startswith(("--settings=", "--pythonpath=")):
                continue
            args.append(arg)
        sys.exit(self.run_pytest(args))

    def handle(self, *args, pytest_args=(), **options):  # call_command("test", ...) path
        sys.exit(self.run_pytest(list(pytest_args)))

    def run_pytest(self, args):
        # Spark tests need Java and the JDBC jar, browser tests Chromium, the pooler's tests and the bench's pooler
        # part PgBouncer: installed here where missing, before any test, so that no test depends on another having
        # installed a package first and no two test processes run apt-get at once.
        absent = system_packages.ensure(TEST_PACKAGES)
        if absent and in_ci():
            self.stderr.write(
                self.style.ERROR(
                    f"CI=true: missing system packages {system_packages.describe(absent)} (see above why); "
                    "the Spark, browser, workflow-graph and pooler tests would skip, and nothing may skip in CI"
                )
            )
            return 1
        try:
            workers = int(env_number("JOBSITE_TEST_WORKERS", 0, expected=NUMBER, error=CommandError))
            budget = env_number("JOBSITE_TEST_BUDGET_MINUTES", BUDGET_MINUTES, expected=NUMBER, error=CommandError) * 60
        except CommandError as exc:
            self.stderr.write(self.style.ERROR(str(exc)))
            return 1
        cmd = [sys.executable, "-m", "pytest", *parallel_args(args, workers), *args]
        started = time.monotonic()
        # pytest and its xdist workers in a process group of their own: a stop (Ctrl-C, the budget, SIGTERM) reaches
        # them all, so each worker's tests end their fixtures (and the processes those started), not only the
        # controller; and a SIGINT to pytest's group never reaches a script that runs this command (.ci/run).
        # SIGINT back to its default in the child, so Python there turns it into KeyboardInterrupt: a shell starts a
        # background job (`cmd &`, nohup) with SIGINT ignored, a child inherits that, and the budget's stop would
        # then be ignored until the grace's SIGKILL, with no report.
        proc = subprocess.Popen(
            cmd,
            cwd=settings.BASE_DIR,
            env={key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"},
            start_new_session=True,
            preexec_fn=_default_sigint,
        )

        def stop(signum: int = signal.SIGINT) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

        signal.signal(signal.SIGTERM, lambda signum, frame: stop(signal.SIGTERM))
        over_budget = False
        while True:
            try:
                left = budget - (time.monotonic() - started) if budget and not over_budget else None
                code = proc.wait(timeout=max(left, 0) if left is not None else None)
                break
            except subprocess.TimeoutExpired:  # past the budget: stop it as Ctrl-C would, so it still reports
                over_budget = True
                self.stderr.write(
                    self.style.ERROR(f"the tests passed their budget of {budget / 60:g} minutes: stopping them")
                )
                stop()
                try:
                    code = proc.wait(timeout=REPORT_GRACE)
                except subprocess.TimeoutExpired:
                    stop(signal.SIGKILL)
                    code = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C: passed on to pytest's group, which still writes its report
                stop()
                continue
        if over_budget:
            self.stderr.write(
                self.style.ERROR(
                    f"FAILED: the test suite ran past its budget of {budget / 60:g} minutes "
                    f"(JOBSITE_TEST_BUDGET_MINUTES) and was stopped after {(time.monotonic() - started) / 60:.1f} "
                    "minutes; "
                    "the time per tier and group above says where it went. Make the slow tests cheaper "
                    "(docs/development.md#in-parallel) rather than raising the budget."
                )
            )
            return 1
        if code == NO_TESTS_COLLECTED:
            self.stderr.write(self.style.ERROR("no tests ran (pytest collected none); counting that as a failure"))
            return 1
        return code
