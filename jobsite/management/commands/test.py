"""``manage.py test [pytest args...]``: run the test suite with pytest (replaces Django's test runner).

Everything after ``test`` goes to pytest untouched (``-x``, ``-k expr``, ``-m "not spark"``, paths, node ids).
pytest's exit code becomes the command's; "no tests collected" (pytest's 5) counts as a failure. Under
``CI=true`` a system package that is missing after the install attempt fails the run at once (exit 1, naming it):
the tests that need it would only skip, and no test may skip in CI (tests/skip_guard.py).
"""

import argparse
import os
import subprocess
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from jobsite import system_packages
from jobsite.ci import in_ci

NO_TESTS_COLLECTED = 5


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
        # Spark tests need Java and the JDBC jar, browser tests Chromium: installed here where missing.
        absent = system_packages.ensure(["java", "jdbc", "chromium", "graphviz"])
        if absent and in_ci():
            self.stderr.write(
                self.style.ERROR(
                    f"CI=true: missing system packages {system_packages.describe(absent)} (see above why); "
                    "the Spark, browser and workflow-graph tests would skip, and nothing may skip in CI"
                )
            )
            return 1
        cmd = [sys.executable, "-m", "pytest", *args]
        proc = subprocess.Popen(cmd, cwd=settings.BASE_DIR, env=os.environ.copy())
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pytest got the Ctrl-C too; let it finish its report
                continue
        if code == NO_TESTS_COLLECTED:
            self.stderr.write(self.style.ERROR("no tests ran (pytest collected none); counting that as a failure"))
            return 1
        return code
