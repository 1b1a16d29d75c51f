"""Shared fixtures: a real PostgreSQL (embedded by default, DATABASE_URL when set) and the environment a
child process (a real worker) needs to reach the same test database."""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support import children as children_support
from tests.support import db_reset, skip_guard, slow_guard, spark_jvm, time_report, xdist_groups

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    db_reset.install()  # a transactional test's teardown truncates only the tables that hold rows
    # (tests/support/db_reset.py)
    skip_guard.install(config)  # under CI=true a run in which any test skipped fails, naming them
    if not config.pluginmanager.has_plugin(slow_guard.PLUGIN):  # tests that start real workers are marked slow
        config.pluginmanager.register(slow_guard, slow_guard.PLUGIN)
    if not config.pluginmanager.has_plugin(time_report.PLUGIN):  # where the run's time went, per tier
        config.pluginmanager.register(time_report, time_report.PLUGIN)
    if not config.pluginmanager.has_plugin(spark_jvm.PLUGIN):  # Spark's classes archived once for all JVMs
        config.pluginmanager.register(spark_jvm, spark_jvm.PLUGIN)
    # In parallel (`manage.py test` runs pytest-xdist): the tests that must not overlap share a worker.
    if config.pluginmanager.hasplugin("xdist") and not config.pluginmanager.has_plugin(xdist_groups.PLUGIN):
        config.pluginmanager.register(xdist_groups, xdist_groups.PLUGIN)


def child_env(db_name: str, **extra: str) -> dict[str, str]:
    """Environment for a subprocess (manage.py run_worker ...) that must use the test database `db_name`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["JOBSITE_NO_BOOTSTRAP"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["DJANGO_SETTINGS_MODULE"] = "jobsite.settings"
    if "DATABASE_URL" in env:
        parts = urlsplit(env["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + db_name))
    else:
        env["JOBSITE_DB_NAME"] = db_name
    env.update(extra)
    return env


@pytest.fixture
def test_db_name(transactional_db) -> str:
    from django.db import connection

    return connection.settings_dict["NAME"]


@pytest.fixture
def manage(test_db_name):
    """Run `python manage.py ...` as a real child process against the test database."""

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None, **kwargs):
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=child_env(test_db_name, **(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )

    return run


@pytest.fixture
def spawn(test_db_name):
    """Start `python manage.py ...` in the background; at teardown every child is killed, with its process group,
    and its server sessions ended before the test database is reset (tests/support/children.py)."""
    from django.db import connection

    children: list[subprocess.Popen] = []
    tag = children_support.new_tag()

    def start(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=child_env(test_db_name, PGAPPNAME=tag, **(env or {})),
            stdout=kwargs.pop("stdout", subprocess.PIPE),
            stderr=kwargs.pop("stderr", subprocess.STDOUT),
            text=True,
            start_new_session=True,
            **kwargs,
        )
        children.append(proc)
        return proc

    start.tag = tag
    yield start
    children_support.end(children, tag, connection)


@pytest.fixture
def worker(spawn, tmp_path):
    """Start `run_worker --worker-id NAME ...` with the test tasks loaded; its output goes to a file. Finished
    items stay in the hot table (ARCHIVE_AFTER an hour, unless `env` says otherwise), so a test counts them there
    however slow the machine: a drain longer than the default minute had the archiver move the first items out
    from under a count (the 10,000-probe test, under a loaded machine)."""
    logs: dict[str, Path] = {}

    def start(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        env = {"JOBSITE_ARCHIVE_AFTER": "3600", **(env or {})}
        logs[name] = tmp_path / f"{name}.log"
        out = logs[name].open("w")
        proc = spawn(
            "run_worker",
            "--worker-id",
            name,
            "--import",
            "tests.tasks.worker_tasks",
            "--poll-interval",
            "0.2",
            *args,
            stdout=out,
            env=env,
        )
        out.close()
        proc.log = logs[name]
        return proc

    return start


@pytest.fixture
def waits_worker(spawn):
    """Start `run_worker` with the workflow-waits test tasks (tests/tasks/workflow_waits_tasks.py) on threads."""

    def start(concurrency: int = 2) -> subprocess.Popen:
        return spawn(
            "run_worker",
            "--concurrency",
            str(concurrency),
            "--pool",
            "thread",
            "--import",
            "tests.tasks.workflow_waits_tasks",
            "--poll-interval",
            "0.2",
        )

    return start


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database without the shipped schedules (migration 0004): every worker a test starts runs the
    scheduler, and "prune-done" firing mid-test would add an item the test did not queue."""
    from queue_app.models import Schedule

    with django_db_blocker.unblock():
        Schedule.objects.all().delete()


@pytest.fixture
def db_proxy(test_db_name):
    """The chaos run's TCP proxy in front of the test database, wherever that is (the embedded server listens on
    a unix socket only): a TCP address for tests that need one (JDBC, a password in DATABASE_URL), and real
    connection loss on demand (`proxy.cut(seconds)`). `proxy.url(password=...)` is a DATABASE_URL through it."""
    from django.db import connection

    from jobsite.chaos.proxy import Proxy

    params = connection.get_connection_params()
    proxy = Proxy(str(params.get("host") or "/var/run/postgresql"), int(params.get("port") or 5432))
    proxy.start()
    user = params.get("user") or "postgres"

    def url(password: str | None = None) -> str:
        password = password or params.get("password")
        auth = f"{user}:{password}" if password else str(user)
        return f"postgres://{auth}@127.0.0.1:{proxy.port}/{test_db_name}"

    proxy.url = url
    yield proxy
    proxy.stop()
