"""Whether this process runs in CI (`CI=true`, as .ci/run and most CI services set it): there nothing may be left
out quietly (a skipped test, a system package that failed to install)."""

import os


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
