"""Running PostgreSQL's programs, as the server's OS user when we are root (PostgreSQL refuses root)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def server_os_user() -> str | None:
    """The OS user a private server of ours runs as when we are root (PostgreSQL refuses root): the system's
    `postgres`, else the `pgserver` user the pgserver wheel creates; None if neither exists."""
    import pwd

    for name in ("postgres", "pgserver"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    return None


def owner_name(path: Path) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (KeyError, FileNotFoundError):
        return None


def run_pg_tool(cmd: list[str], *, as_user: str | None = None, timeout: float | None = None) -> str:
    """Run a PostgreSQL command, optionally as another OS user (we are root then).

    Output goes to temporary files, not pipes: the postmaster that ``pg_ctl start`` leaves behind must not
    hold a pipe of ours open.
    """
    kwargs: dict = {}
    if as_user is not None and is_root():
        import pwd

        entry = pwd.getpwnam(as_user)
        kwargs.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd="/",
            timeout=timeout,
            **kwargs,
        )
        out.seek(0)
        output = out.read()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, output=output)
    return output


def major_of(bindir: Path) -> str | None:
    try:
        out = subprocess.run(
            [str(bindir / "pg_ctl"), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    return match.group(1) if match else None
