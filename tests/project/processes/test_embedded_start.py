"""Starting the embedded PostgreSQL survives a start that fails on a slow machine (jobsite/embedded_pg/lifecycle.py).

pgserver gives `pg_ctl start -w` 10 s; on a loaded machine the server is often still starting when that runs out,
and pgserver then fails reading a log file not written yet (a fresh clone's run once lost its quick chaos run to
it). A failed start waits for a postmaster that is coming up; when none is there, it is tried once more. Each case
starts a real cluster in a directory of its own and stops it."""

import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from jobsite.embedded_pg import lifecycle
from jobsite.embedded_pg.engines import choose_engine
from jobsite.embedded_pg.paths import pgdata_dir

pytestmark = pytest.mark.slow


class Flaky:
    """The real engine, failing its first start before (`before`) or after (`after`) the server was launched."""

    def __init__(self, real, *, before: bool = False, after: bool = False) -> None:
        self.real, self.before, self.after, self.calls = real, before, after, 0

    def start(self, pgdata) -> None:
        self.calls += 1
        if self.calls == 1 and self.before:
            raise FileNotFoundError(f"{pgdata}/log")  # pgserver's error when pg_ctl failed before the server ran
        self.real.start(pgdata)
        if self.calls == 1 and self.after:
            raise subprocess.TimeoutExpired(["pg_ctl", "start"], 10)  # pg_ctl ran out, the server goes on starting


@pytest.fixture
def var_dir(monkeypatch):
    """A var dir of its own, outside pytest's (as root the server runs as pgserver's OS user, which must own its
    data dir: a fresh directory per case)."""
    path = Path(tempfile.mkdtemp(prefix="jobsite-embedded-start-"))
    path.chmod(0o755)
    monkeypatch.setenv("JOBSITE_VAR_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(("case", "calls"), [("after", 1), ("before", 2)])
def test_a_failed_start_waits_for_the_server_or_tries_again(var_dir, case, calls):
    pgdata = pgdata_dir()
    engine = Flaky(choose_engine(pgdata), **{case: True})
    try:
        info = lifecycle._start(engine, pgdata)
        assert info is not None
        with psycopg.connect(dbname="postgres", **lifecycle.connection_params(info)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert engine.calls == calls
    finally:
        lifecycle.stop()


def test_a_start_that_never_runs_a_server_is_a_clear_error(var_dir):
    class Broken:
        calls = 0

        def start(self, pgdata) -> None:
            Broken.calls += 1
            raise FileNotFoundError(f"{pgdata}/log")

        def __repr__(self) -> str:
            return "broken engine"

    with pytest.raises(lifecycle.ImproperlyConfigured, match="Could not start the embedded PostgreSQL"):
        lifecycle._start(Broken(), pgdata_dir())
    assert Broken.calls == 2
