"""Finding the Java runtime Spark needs, with an error that says what to install.

Spark 4 runs on Java 17 or 21. spark-submit takes `$JAVA_HOME/bin/java` when JAVA_HOME is set, else `java` on
PATH; this module looks in the same places so the check and the launch agree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

MIN_JAVA = 17
INSTALL_HINT = (
    "Spark needs Java 17 or newer: install a JRE (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) "
    "or point JAVA_HOME at one."
)


class JavaNotFound(RuntimeError):
    """No usable Java runtime; the message says what was looked for and how to fix it."""


@dataclass(frozen=True)
class JavaInfo:
    executable: str
    version: str  # as `java -version` prints it, e.g. "17.0.15"
    major: int


def java_executable() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


@lru_cache(maxsize=4)
def _probe(executable: str) -> JavaInfo:
    try:
        proc = subprocess.run([executable, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFound(f"`{executable} -version` failed ({exc}). {INSTALL_HINT}") from exc
    # `java -version` writes to stderr: openjdk version "17.0.15" 2025-04-15 (Java 8 said "1.8.0_x").
    match = re.search(r'version "([^"]+)"', proc.stderr + proc.stdout)
    if proc.returncode != 0 or not match:
        raise JavaNotFound(f"`{executable} -version` did not report a version. {INSTALL_HINT}")
    version = match.group(1)
    parts = version.split(".")
    major = int(parts[1] if parts[0] == "1" else re.match(r"\d+", parts[0]).group())
    if major < MIN_JAVA:
        raise JavaNotFound(f"{executable} is Java {version}; {INSTALL_HINT}")
    return JavaInfo(executable=executable, version=version, major=major)


def check_java() -> JavaInfo:
    """The Java runtime spark-submit will use; JavaNotFound with an install hint if there is none."""
    executable = java_executable()
    if executable is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if "JAVA_HOME" in os.environ
            else ("no `java` on PATH")
        )
        raise JavaNotFound(f"Java not found ({where}). {INSTALL_HINT}")
    return _probe(executable)
