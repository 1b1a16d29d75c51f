"""`queue_chaos --quick` as its own process on a private embedded server, and whether PostgreSQL's server binaries are
here: for the chaos runs' tests."""

import os
import subprocess
import sys

from tests.support.paths import ROOT


def _has_postgres_binaries() -> bool:
    from jobsite.chaos.cluster import find_bindir

    try:
        find_bindir()
    except RuntimeError:
        return False
    return True


def run_quick_chaos(tmp_path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `queue_chaos --quick ARGS` as its own process on a private embedded server under tmp_path (no
    DATABASE_URL needed: the command starts one), stopped afterwards whatever happened; assert it passed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(JOBSITE_NO_BOOTSTRAP="1", JOBSITE_VAR_DIR=str(tmp_path / "var"))
    manage = [sys.executable, str(ROOT / "manage.py")]
    try:
        result = subprocess.run(
            [*manage, "queue_chaos", "--quick", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        subprocess.run([*manage, "embedded_db", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result
