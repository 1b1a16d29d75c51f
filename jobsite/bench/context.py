"""What every part of the bench shares: the PostgreSQL server (found through Django's default database),
scratch databases on it, child processes and their environments, progress lines, and `drain()`, which turns
"N jobs queued, workers started" into a throughput figure the same way for jobsite and for every peer."""

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .sizes import Sizes

ROOT = Path(__file__).resolve().parent.parent.parent
MANAGE = ROOT / "manage.py"


@dataclass(frozen=True)
class Server:
    """Where the server is and who we are on it; `host` may be a unix socket directory (embedded cluster)."""

    host: str
    port: str
    user: str
    password: str

    def conninfo(self, dbname: str) -> str:
        parts = {"host": self.host, "port": self.port, "user": self.user, "password": self.password}
        return make_conninfo(dbname=dbname, **{k: v for k, v in parts.items() if v})

    def libpq_env(self) -> dict[str, str]:
        """PGHOST & co. for libpq command-line tools (pgbench)."""
        pairs = {"PGHOST": self.host, "PGPORT": self.port, "PGUSER": self.user, "PGPASSWORD": self.password}
        return {k: v for k, v in pairs.items() if v}

    def connect(self, dbname: str, **kwargs: Any) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(dbname), autocommit=True, **kwargs)


def server_from_django(alias: str = "default") -> Server:
    """The server behind a Django database (the embedded cluster is started if it is not running)."""
    from django.db import connections

    params = connections[alias].get_connection_params()
    return Server(
        host=str(params.get("host") or ""),
        port=str(params.get("port") or ""),
        user=str(params.get("user") or ""),
        password=str(params.get("password") or ""),
    )


class Progress:
    """Progress lines while the bench runs: elapsed time, the part running, what it just did."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._t0 = time.monotonic()

    def __call__(self, part: str, message: str) -> None:
        self._write(f"[{time.monotonic() - self._t0:7.1f}s] {part:<9} {message}")


@dataclass
class BenchContext:
    server: Server
    db_prefix: str
    progress: Progress
    log_dir: Path
    keep_databases: bool = False
    created: list[str] = field(default_factory=list)
    # The pooler part's pooler (postgres://host:port, in transaction mode, in front of this server); None: the
    # part starts a PgBouncer of its own.
    pooler_dsn: str | None = None

    def db_name(self, part: str) -> str:
        return f"{self.db_prefix}_{part}"

    def fresh_database(self, part: str, *, template: str | None = None) -> str:
        """Drop and create the scratch database for `part` (a copy of the database `template`, which nobody may
        be connected to, when given); returns its name."""
        name = self.db_name(part)
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with self.server.connect("postgres") as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(create)
        if name not in self.created:
            self.created.append(name)
        return name

    def drop_databases(self) -> None:
        if self.keep_databases:
            return
        with self.server.connect("postgres") as conn:
            for name in self.created:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self.created.clear()

    def log_path(self, name: str) -> Path:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / f"{name}.log"


BENCH_SECRET_KEY = secrets.token_urlsafe(50)  # per run; bench children only


def django_child_env(dbname: str, settings_module: str = "jobsite.settings", **extra: str) -> dict[str, str]:
    """Environment for a child `manage.py ...` that must use the scratch database `dbname` on the same server."""
    env = dict(os.environ)
    # As deployed: DEBUG off (with DEBUG on, Django records every query of every process, which costs each
    # Django-based queue, ours and the peers alike), plain HTTP on loopback.
    env.setdefault("DEBUG", "false")
    env.setdefault("SECRET_KEY", BENCH_SECRET_KEY)
    env.setdefault("ALLOWED_HOSTS", "localhost,127.0.0.1,testserver")
    env.setdefault("SECURE_SSL_REDIRECT", "false")
    env["JOBSITE_NO_BOOTSTRAP"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["DJANGO_SETTINGS_MODULE"] = settings_module
    if "DATABASE_URL" in env:
        parts = urlsplit(env["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + dbname))
    else:
        env["JOBSITE_DB_NAME"] = dbname
    env.update(extra)
    return env


def spawn(args: Iterable[str], *, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a child in a process group of its own (stopped as a group: prefork pools have children too)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(args), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def manage_args(*args: str) -> list[str]:
    return [sys.executable, str(MANAGE), *args]


def stop(procs: Iterable[subprocess.Popen], grace: float = 15.0) -> None:
    """SIGTERM each child's process group, then SIGKILL what is still there after `grace` seconds."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(10)
        # Whatever the leader left behind in its group (pool children) goes too.
        _signal_group(proc, signal.SIGKILL)


def wait_until(predicate, timeout: float, what: str, procs: Iterable[subprocess.Popen], poll: float = 0.02) -> float:
    """Poll `predicate` every `poll` seconds until it holds; the seconds it took. Raises when `timeout` passes
    first or one of `procs` (the workers doing the work) has exited, naming `what` was awaited."""
    t0 = time.perf_counter()
    while not predicate():
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"{what}: not done after {timeout:.0f}s")
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{what}: the worker exited")
        time.sleep(poll)
    return time.perf_counter() - t0


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class Drain:
    """How a backlog of `jobs` drained. `steady_per_s` counts the jobs done between 10% and 90% of the backlog
    over the time between, so process start-up and the last stragglers do not count; `wall_per_s` is jobs over
    the whole time from workers started to backlog empty."""

    jobs: int
    done: int
    wall_seconds: float
    steady_seconds: float
    steady_per_s: float
    wall_per_s: float

    @property
    def complete(self) -> bool:
        return self.done >= self.jobs

    def too_short(self, target_seconds: float) -> bool:
        """Drained so fast that the sampling interval is a visible part of the steady window."""
        return self.complete and self.steady_seconds < target_seconds / 4

    def jobs_for(self, target_seconds: float, most: int) -> int:
        """A backlog that would keep workers this fast busy for about `target_seconds`."""
        return max(self.jobs, min(most, round(self.steady_per_s * target_seconds)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "done": self.done,
            "wall_seconds": round(self.wall_seconds, 3),
            "steady_seconds": round(self.steady_seconds, 3),
            "steady_per_s": round(self.steady_per_s, 1),
            "wall_per_s": round(self.wall_per_s, 1),
        }


def drain(
    remaining: Callable[[], int],
    jobs: int,
    procs: Iterable[subprocess.Popen],
    *,
    timeout: float,
    interval: float = 0.1,
    report: Callable[[str], None] | None = None,
) -> Drain:
    """Sample `remaining()` until it reaches 0, every worker process has exited, or `timeout` passes. Each
    sample is a count over the open jobs (tens of milliseconds of a server core at 100,000 open): sampled every
    20 ms it took half a core of this 2-core machine from the queue being measured. The steady rate is
    interpolated between samples, so 0.1 s is precise enough for drains of seconds."""
    procs = list(procs)
    t0 = time.monotonic()
    samples: list[tuple[float, int]] = [(0.0, 0)]
    next_report = 2.0
    while True:
        left = remaining()
        now = time.monotonic() - t0
        samples.append((now, jobs - left))
        if left <= 0 or now > timeout:
            break
        if procs and all(p.poll() is not None for p in procs):
            left = remaining()  # the last settle may have landed after the sample above
            samples.append((time.monotonic() - t0, jobs - left))
            break
        if report and now >= next_report:
            report(f"{jobs - left:,}/{jobs:,} done")
            next_report = now + 2.0
        time.sleep(interval)
    wall, done = samples[-1]
    done = max(0, min(done, jobs))
    wall_rate = done / wall if wall > 0 else 0.0
    t10, t90 = _crossing(samples, 0.1 * jobs), _crossing(samples, 0.9 * jobs)
    window = t90 - t10 if t10 is not None and t90 is not None else 0.0
    steady = 0.8 * jobs / window if window > 0 else wall_rate
    return Drain(
        jobs=jobs, done=done, wall_seconds=wall, steady_seconds=window, steady_per_s=steady, wall_per_s=wall_rate
    )


def _crossing(samples: list[tuple[float, int]], target: float) -> float | None:
    """When the done count crossed `target`, interpolated between the two samples around it."""
    for (t_a, d_a), (t_b, d_b) in zip(samples, samples[1:], strict=False):
        if d_b >= target > d_a:
            return t_a + (target - d_a) / (d_b - d_a) * (t_b - t_a)
    return None


def tune[V](
    variants: Iterable[V],
    attempt: Callable[[V, int, float], Drain],
    *,
    jobs: int,
    sizes: Sizes,
) -> tuple[list[tuple[V, Drain]], tuple[V, Drain] | None]:
    """Try each variant on a backlog of `jobs` (called as `attempt(variant, jobs, timeout)`) and keep the fastest
    complete one. A drain too short to measure well is run again on a backlog scaled to the speed seen, and
    later variants keep the larger backlog; a variant is given up once it is clearly under a quarter of the best
    speed so far."""
    tried: list[tuple[V, Drain]] = []
    best: tuple[V, Drain] | None = None
    for variant in variants:
        result = attempt(variant, jobs, _patience(jobs, best, sizes))
        if result.too_short(sizes.drain_seconds) and jobs < sizes.most_jobs:
            jobs = result.jobs_for(sizes.drain_seconds, sizes.most_jobs)
            result = attempt(variant, jobs, _patience(jobs, best, sizes))
        tried.append((variant, result))
        if result.complete and (best is None or result.steady_per_s > best[1].steady_per_s):
            best = (variant, result)
    return tried, best


def _patience(jobs: int, best: tuple[object, Drain] | None, sizes: Sizes) -> float:
    if best is None:
        return sizes.drain_timeout
    quarter_speed = jobs / (best[1].steady_per_s / 4) + 30  # + start-up
    return min(sizes.drain_timeout, max(sizes.drain_seconds * 3, quarter_speed))
