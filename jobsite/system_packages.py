"""OS packages some parts of jobsite need, installed by the README's commands where they are missing.

Spark runs need a Java runtime and PostgreSQL's JDBC driver (Debian: openjdk-17-jre-headless,
libpostgresql-jdbc-java); the browser tests need Debian's chromium; the admin's workflow graph needs Graphviz's
`dot` (Debian: graphviz); the tests behind a connection pooler need PgBouncer (Debian: pgbouncer, in /usr/sbin,
not on every user's PATH); the Celery peer of `queue_bench` needs a Redis server (Debian: redis-server, which
.ci/run starts when none answers). Nothing is downloaded outside the package manager. Without root (or sudo) or
apt-get, this says what to install and the tests that need the missing piece skip with that reason; under
`CI=true` the caller fails instead (`python3 -m jobsite.system_packages NAME...` exits 1 with what is missing).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

# name -> (how to tell it is there, Debian packages)
NEEDS = {
    "java": (lambda: shutil.which("java") is not None, ["openjdk-17-jre-headless"]),
    "jdbc": (JDBC_JAR.exists, ["libpostgresql-jdbc-java"]),
    "chromium": (lambda: shutil.which("chromium") is not None, ["chromium", "fonts-liberation"]),
    # The workflow graph in the admin is laid out by Graphviz's dot (through the `graphviz` PyPI package).
    "graphviz": (lambda: shutil.which("dot") is not None, ["graphviz"]),
    "redis": (lambda: shutil.which("redis-server") is not None, ["redis-server"]),
    "pgbouncer": (lambda: Path(PGBOUNCER).exists(), ["pgbouncer"]),
}


def missing(names: list[str]) -> list[str]:
    return [name for name in names if not NEEDS[name][0]()]


def ensure(names: list[str], *, out=sys.stderr) -> list[str]:
    """Install the Debian packages behind `names` that are missing. Returns what is still missing."""
    absent = missing(names)
    if not absent or os.environ.get("JOBSITE_NO_SYSTEM_PACKAGES") == "1":
        return absent
    packages = [pkg for name in absent for pkg in NEEDS[name][1]]
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None or not shutil.which("apt-get"):
        print(f"jobsite: missing {', '.join(absent)}; install the OS packages {' '.join(packages)}", file=out)
        return absent
    print(f"jobsite: installing {' '.join(packages)} (apt-get) ...", file=out, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    quiet = {"stdout": subprocess.DEVNULL, "env": env}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=False, **quiet)
    install = [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    done = subprocess.run(install, stderr=subprocess.PIPE, text=True, **quiet)
    if done.returncode != 0:
        why = "\n".join(done.stderr.strip().splitlines()[-10:])
        print(f"jobsite: apt-get install {' '.join(packages)} failed (exit {done.returncode}):\n{why}", file=out)
    return missing(names)


def describe(names: list[str]) -> str:
    """`java (openjdk-17-jre-headless), ...`: what is missing and the Debian packages that bring it."""
    return ", ".join(f"{name} ({' '.join(NEEDS[name][1])})" for name in names)


def main(argv: list[str]) -> int:
    """`python3 -m jobsite.system_packages NAME...`: install what is missing; exit 1 naming what still is."""
    unknown = [name for name in argv if name not in NEEDS]
    if unknown or not argv:
        print(f"usage: python3 -m jobsite.system_packages {{{','.join(NEEDS)}}}...", file=sys.stderr)
        return 2
    absent = ensure(argv)
    if absent:
        print(f"jobsite: still missing: {describe(absent)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
