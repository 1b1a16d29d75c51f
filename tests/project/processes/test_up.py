"""`manage.py up` on the embedded PostgreSQL, as a real process stopped with Ctrl-C: it stops the embedded server
it started, and leaves running one it found running. The server lives in this module's own data directory
(JOBSITE_VAR_DIR), never the project's. With DATABASE_URL set, `up` never starts the embedded server, so it
never stops one either (embedded_pg.started_here)."""

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def env_for(var_dir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PYTEST_")}
    env.update(
        JOBSITE_VAR_DIR=str(var_dir),
        JOBSITE_NO_BOOTSTRAP="1",
        JOBSITE_NO_SYSTEM_PACKAGES="1",
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="jobsite.settings",
    )
    return env


def manage_in(var_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env_for(var_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )


def embedded_running(var_dir) -> bool:
    status = manage_in(var_dir, "embedded_db", "status")  # no system checks: it starts nothing
    assert status.returncode == 0, status.stderr
    return re.search(r"^running\s+True$", status.stdout, re.M) is not None


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("up-var")
    yield path
    manage_in(path, "embedded_db", "stop")  # whatever a test left running


def up_then_ctrl_c(var_dir, log) -> str:
    """Start `up` (web server only), wait until it says it is up, press Ctrl-C; its whole output."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "up", "--no-worker", "--port", str(port), "--web-workers", "1"],
            cwd=ROOT,
            env=env_for(var_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "jobsite is up" in log.read_text() or proc.poll() is not None, 600, what="`up` to be up")
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return log.read_text()


def test_ctrl_c_stops_the_embedded_postgresql_that_up_started(var_dir, tmp_path):
    assert not embedded_running(var_dir)

    output = up_then_ctrl_c(var_dir, tmp_path / "up.log")

    assert "(started here: stopped on exit)" in output
    assert "embedded PostgreSQL stopped (`up` started it" in output
    assert not embedded_running(var_dir)


def test_ctrl_c_leaves_running_the_embedded_postgresql_up_found_running(var_dir, tmp_path):
    started = manage_in(var_dir, "embedded_db", "start")
    assert started.returncode == 0, started.stderr

    output = up_then_ctrl_c(var_dir, tmp_path / "up.log")

    assert "(already running: left running)" in output
    assert "embedded PostgreSQL stopped" not in output
    assert embedded_running(var_dir)
    # Its hints say python3, as the README does.
    assert "(try: python3 manage.py workflow start demo_pipeline --wait)" in output
    assert not re.search(r"(?<!\S)python manage\.py", output)
