"""Make ``python3 manage.py ...`` work from a fresh clone: run it inside the project's own ``.venv``.

STANDARD LIBRARY ONLY, and syntax for Python >= 3.8: this runs under whatever ``python3`` the user has (often
older than the 3.12 that Django 6.1 needs), before Django is imported.

``ensure_venv()``:

* already running the project's ``.venv`` python -> reinstall if pyproject.toml changed, then return;
* otherwise find Python 3.12+ (3.12 first: the ``pgserver`` wheels with embedded PostgreSQL are cp312 only),
  create ``.venv`` with it if missing, ``pip install -e .[dev]`` when pyproject.toml changed (its hash is
  kept in ``.venv/.jobsite-installed``), and re-run the same command with ``.venv/bin/python`` (``os.execv``).

Set ``JOBSITE_NO_BOOTSTRAP=1`` to skip all of it (CI or tools that manage their own environment) and
``JOBSITE_PYTHON=/path/to/python3.12`` to choose the interpreter.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")
STAMP = os.path.join(VENV, ".jobsite-installed")
INSTALL_LOG = os.path.join(VENV, ".jobsite-install.log")
MIN_VERSION = (3, 12)
PREFERRED = (3, 12)  # pgserver (embedded PostgreSQL 16) ships cp312 wheels only
EXTRAS = "dev"

NEED_PYTHON = (
    "jobsite needs Python 3.12+ (Django 6.1); install it, e.g. `pyenv install 3.12` or your OS package "
    "(python3.12 and python3.12-venv), then rerun. Or point JOBSITE_PYTHON at one."
)

_PROBE = "import sys, venv, ensurepip; print(sys.version_info[0], sys.version_info[1], sys.executable)"


def _say(message: str) -> None:
    sys.stderr.write("jobsite: " + message + "\n")
    sys.stderr.flush()


def _venv_python() -> str:
    if os.name == "nt":  # pragma: no cover
        return os.path.join(VENV, "Scripts", "python.exe")
    return os.path.join(VENV, "bin", "python")


def _in_project_venv() -> bool:
    try:
        return os.path.samefile(sys.prefix, VENV)
    except OSError:
        return False


def _pyproject_hash() -> str:
    digest = hashlib.sha256()
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        digest.update(fh.read())
    digest.update(("extras=" + EXTRAS).encode())
    return digest.hexdigest()


def _installed_hash() -> str:
    try:
        with open(STAMP) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _probe(executable: str) -> tuple[int, int, str] | None:
    """(major, minor, real executable) of a usable interpreter (with venv and ensurepip), else None."""
    try:
        out = subprocess.run(
            [executable, "-c", _PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    parts = out.stdout.strip().split(" ", 2)
    try:
        return int(parts[0]), int(parts[1]), parts[2]
    except (IndexError, ValueError):
        return None


def _version_sort_key(name: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", name)) or (0,)


def _candidates() -> list[str]:
    """Interpreters worth probing, most wanted first (duplicates are fine; they are skipped later)."""
    found: list[str] = []
    override = os.environ.get("JOBSITE_PYTHON")
    if override:
        found.append(override)
    minors = ["3.12", "3.13", "3.14", "3.15"]
    for minor in minors:
        exe = shutil.which("python" + minor)
        if exe:
            found.append(exe)

    roots = []
    if os.environ.get("PYENV_ROOT"):
        roots.append(os.environ["PYENV_ROOT"])
    pyenv = shutil.which("pyenv")
    if pyenv:
        try:
            out = subprocess.run(
                [pyenv, "root"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                timeout=30,
            )
            if out.returncode == 0 and out.stdout.strip():
                roots.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    roots += [os.path.expanduser("~/.pyenv"), "/root/.pyenv", "/usr/local/pyenv", "/opt/pyenv"]
    for root in roots:
        versions = os.path.join(root, "versions")
        try:
            names = os.listdir(versions)
        except OSError:
            continue
        for name in sorted(names, key=_version_sort_key, reverse=True):
            if re.match(r"^3\.\d+(\.\d+)?$", name):  # plain CPython builds (no -dev, pypy, envs)
                found.append(os.path.join(versions, name, "bin", "python3"))

    # uv-managed and common install locations
    uv_dir = os.path.expanduser("~/.local/share/uv/python")
    try:
        for name in sorted(os.listdir(uv_dir), key=_version_sort_key, reverse=True):
            if name.startswith("cpython-3."):
                found.append(os.path.join(uv_dir, name, "bin", "python3"))
    except OSError:
        pass
    for prefix in ("/usr/local/bin", "/usr/bin", "/opt/homebrew/bin", "/opt/local/bin"):
        for minor in minors:
            found.append(os.path.join(prefix, "python" + minor))

    # the Python launcher (`py -3.12`), then whatever python3 / this interpreter are
    py = shutil.which("py")
    if py:
        for minor in minors:
            try:
                out = subprocess.run(
                    [py, "-" + minor, "-c", "import sys; print(sys.executable)"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    timeout=30,
                )
                if out.returncode == 0 and out.stdout.strip():
                    found.append(out.stdout.strip())
            except (OSError, subprocess.SubprocessError):
                pass
    for name in ("python3", "python"):
        exe = shutil.which(name)
        if exe:
            found.append(exe)
    found.append(sys.executable)
    return found


def find_python() -> tuple[str, tuple[int, int]] | None:
    """The best Python >= 3.12 here: 3.12 if there is one, else the lowest newer version."""
    best = None
    seen = set()
    for candidate in _candidates():
        if not candidate or not os.path.exists(candidate):
            continue
        real = os.path.realpath(candidate)
        if real in seen:
            continue
        seen.add(real)
        probed = _probe(candidate)
        if probed is None:
            continue
        version = (probed[0], probed[1])
        if version < MIN_VERSION:
            continue
        if version == PREFERRED:
            return probed[2], version
        if best is None or version < best[1]:
            best = (probed[2], version)
    return best


class _Lock:
    """Serialise bootstraps of this checkout (a flock on the project directory; no stray lock file)."""

    def __enter__(self) -> _Lock:
        self.fd = None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        self.fd = os.open(ROOT, os.O_RDONLY)
        with contextlib.suppress(OSError):  # a filesystem without flock on directories: go on unlocked
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock


def _venv_version() -> tuple[int, int] | None:
    if not os.path.exists(_venv_python()):
        return None
    probed = _probe(_venv_python())
    return (probed[0], probed[1]) if probed else None


def _create_venv() -> None:
    found = find_python()
    if found is None:
        sys.stderr.write(NEED_PYTHON + "\n")
        sys.exit(2)
    executable, version = found
    if os.path.exists(VENV):
        _say("removing unusable .venv")
        shutil.rmtree(VENV)
    if version != PREFERRED:
        _say(
            f"note: Python {version[0]}.{version[1]} chosen; pgserver (embedded PostgreSQL) needs 3.12, so "
            "system PostgreSQL binaries (initdb/pg_ctl) will be used instead"
        )
    _say(f"creating .venv with python{version[0]}.{version[1]} ({executable}) ...")
    started = time.monotonic()
    result = subprocess.run([executable, "-m", "venv", VENV], stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        _say(f"could not create .venv with {executable} (exit {result.returncode})")
        sys.exit(result.returncode or 1)
    _say(f"created .venv in {time.monotonic() - started:.1f}s")


def _install() -> None:
    """``pip install -e .[dev]`` into .venv; output goes to .venv/.jobsite-install.log (shown on failure)."""
    want = _pyproject_hash()
    if os.path.exists(STAMP):
        os.unlink(STAMP)
    _say(f"installing jobsite[{EXTRAS}] into .venv (pip install -e '.[{EXTRAS}]'; log: {INSTALL_LOG}) ...")
    started = time.monotonic()
    cmd = [
        _venv_python(),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "-e",
        f".[{EXTRAS}]",
    ]
    with open(INSTALL_LOG, "w") as log:
        result = subprocess.run(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        try:
            with open(INSTALL_LOG) as fh:
                tail = fh.read().splitlines()[-40:]
        except OSError:
            tail = []
        sys.stderr.write("\n".join(tail) + "\n")
        _say(f"pip install failed (exit {result.returncode}); full log: {INSTALL_LOG}")
        sys.exit(result.returncode or 1)
    with open(STAMP, "w") as fh:
        fh.write(want + "\n")
    _say(f"installed in {time.monotonic() - started:.1f}s")


def _prepare_venv() -> None:
    """Create .venv if missing or unusable, install if pyproject.toml changed. Holds the bootstrap lock."""
    with _Lock():
        version = _venv_version()
        if version is None or version < MIN_VERSION:
            _create_venv()
        if _installed_hash() != _pyproject_hash():
            _install()


def ensure_venv() -> None:
    """Run the current command in the project's .venv, creating and installing it first if needed."""
    if os.environ.get("JOBSITE_NO_BOOTSTRAP", "").strip().lower() in ("1", "true", "yes", "on"):
        return
    if _in_project_venv():
        os.environ.pop("JOBSITE_BOOTSTRAPPED", None)  # children may run other interpreters on purpose
        if _installed_hash() != _pyproject_hash():
            _prepare_venv()  # pyproject.toml changed since the last install
        return
    if os.environ.get("JOBSITE_BOOTSTRAPPED") == "1":
        _say(f"re-executed but still not inside {VENV} (sys.prefix={sys.prefix}); giving up")
        sys.exit(1)
    _prepare_venv()
    python = _venv_python()
    os.environ["JOBSITE_BOOTSTRAPPED"] = "1"
    argv = [python, os.path.abspath(sys.argv[0])] + sys.argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, argv)
