"""queue_bench's pooler part (issue 46): jobsite behind a real PgBouncer in transaction mode against jobsite
straight to the server, in one run, on one scratch database.

- end to end: the no-op drain of one worker host (the settings that won the jobsite part's end to end, else the
  grid's first), in pairs: a direct drain and a pooled one back to back, the order alternating, the figure the
  median of the pairs' ratios (pooled / direct) with the load average at each pair;
- idle enqueue-to-start: single probe items queued one at a time (jobsite_side.measure_latency), direct, then
  behind PgBouncer with the worker's LISTEN connection past it (LISTEN_DATABASE_URL), then behind PgBouncer
  without one (the worker polls every POLL_INTERVAL s: the figure the poll interval bounds).

Pooled means what a deployment behind PgBouncer does: the workers' DATABASE_URL and the enqueuing connection
through PgBouncer, JOBSITE_CONNECTION_POOLER=transaction (no prepared statements, no session state: leader rows
for the wake and maintenance duties). PgBouncer's pool is POOL_SIZE server connections, fewer than the workers'
client connections, so transactions do share them.
"""

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from urllib.parse import quote, urlencode, urlsplit

from django.conf import settings as django_settings
from django.db import connections
from django.test import override_settings

from jobsite import pgbouncer

from .context import BenchContext, django_child_env, drain, log_tail, spawn, stop
from .jobsite_side import (
    ALIAS,
    NOOP_TASK,
    WorkerSettings,
    _clear_queue,
    _Remaining,
    bench_database,
    describe,
    measure_latency,
    run_worker_available,
    worker_args,
)
from .report import Figure, Results
from .sizes import Sizes

POOL_SIZE = 8
POLL_INTERVAL = 0.25  # the polling worker's --poll-interval (no LISTEN connection past the pooler)
POOLED_ALIAS = "jobsite_bench_pooled"


def _settings(sizes: Sizes, results: Results) -> WorkerSettings:
    e2e = results.figures.get("jobsite.e2e")
    chosen = e2e.detail.get("worker_settings") if e2e is not None else None
    return tuple(chosen) if chosen else sizes.e2e_grid[0]


def _load() -> str:
    return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def _direct_url(db: str) -> str:
    """The scratch database's URL straight to the server (LISTEN_DATABASE_URL's; a socket directory as libpq's
    host parameter)."""
    params = connections[ALIAS].get_connection_params()
    host, port = str(params.get("host") or "127.0.0.1"), str(params.get("port") or 5432)
    user, password = str(params.get("user") or "postgres"), params.get("password")
    auth = f"{quote(user)}:{quote(password)}" if password else quote(user)
    if host.startswith("/"):
        return f"postgresql://{auth}@/{db}?{urlencode({'host': host, 'port': port})}"
    return f"postgres://{auth}@{host}:{port}/{db}"


def _pooled_env(db: str, host: str, port: int) -> dict[str, str]:
    """A worker's environment behind the pooler at host:port: DATABASE_URL through it, the pooler mode, and the
    LISTEN connection straight to the server."""
    params = connections[ALIAS].get_connection_params()
    user, password = str(params.get("user") or "postgres"), params.get("password")
    auth = f"{quote(user)}:{quote(password)}" if password else quote(user)
    return {
        "DATABASE_URL": f"postgres://{auth}@{host}:{port}/{db}",
        "JOBSITE_CONNECTION_POOLER": "transaction",
        "JOBSITE_LISTEN_DATABASE_URL": _direct_url(db),
    }


@contextmanager
def _pooled_here(host: str, port: int) -> Iterator[None]:
    """This process as a pooled client: its engine calls on POOLED_ALIAS go through PgBouncer, with
    CONNECTION_POOLER = "transaction" (no prepared statement: psycopg's names would collide across clients)."""
    base = connections[ALIAS].settings_dict
    connections.settings[POOLED_ALIAS] = {**base, "HOST": host, "PORT": str(port), "CONN_MAX_AGE": 0}
    jobsite = {**getattr(django_settings, "JOBSITE", {}), "CONNECTION_POOLER": "transaction"}
    try:
        with override_settings(JOBSITE=jobsite):
            yield
    finally:
        connections[POOLED_ALIAS].close()
        del connections[POOLED_ALIAS]
        del connections.settings[POOLED_ALIAS]


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    if not run_worker_available():
        results.add(Figure("pooler.e2e_ratio", "behind PgBouncer / direct, end to end", None, "x", "n/a"))
        return
    settings = _settings(sizes, results)
    with bench_database(ctx, "pooler") as db:
        if ctx.pooler_dsn:
            where = urlsplit(ctx.pooler_dsn)
            ctx.progress("pooler", f"the pooler at {where.hostname}:{where.port or 5432} in front of {db}")
            pooled_env = _pooled_env(db, where.hostname or "127.0.0.1", where.port or 5432)
            _e2e_pairs(ctx, sizes, results, db, settings, {}, pooled_env)
            _latencies(ctx, sizes, results, db, settings, where.hostname or "127.0.0.1", where.port or 5432, pooled_env)
            return
        server = connections[ALIAS].get_connection_params()
        try:
            bouncer = pgbouncer.start(
                str(server.get("host") or "127.0.0.1"),
                str(server.get("port") or 5432),
                str(server.get("user") or "postgres"),
                pool_size=POOL_SIZE,
            )
        except RuntimeError as exc:
            ctx.progress("pooler", f"no PgBouncer: {exc}")
            results.add(Figure("pooler.e2e_ratio", "behind PgBouncer / direct, end to end", None, "x", f"n/a ({exc})"))
            return
        try:
            ctx.progress("pooler", f"PgBouncer {bouncer.port} (transaction mode, pool {POOL_SIZE}) in front of {db}")
            pooled_env = _pooled_env(db, "127.0.0.1", bouncer.port)
            _e2e_pairs(ctx, sizes, results, db, settings, {}, pooled_env)
            _latencies(ctx, sizes, results, db, settings, "127.0.0.1", bouncer.port, pooled_env)
        finally:
            bouncer.stop()


def _e2e_pairs(
    ctx: BenchContext,
    sizes: Sizes,
    results: Results,
    db: str,
    settings: WorkerSettings,
    direct_env: dict[str, str],
    pooled_env: dict[str, str],
) -> None:
    from queue_app import engine
    from queue_app.conf import queue_settings

    queue, jobs = queue_settings.DEFAULT_QUEUE, sizes.e2e_jobs
    rates: dict[str, list[float]] = {"direct": [], "pooled": []}
    ratios: list[float] = []
    loads = [_load()]

    def one(side: str, tag: str) -> float | None:
        _clear_queue(queue)
        engine.enqueue_many(NOOP_TASK, [{} for _ in range(jobs)], queue=queue, using=ALIAS)
        env = django_child_env(db, **(pooled_env if side == "pooled" else direct_env))
        args = worker_args(settings, burst=True)
        procs = [spawn(args, env=env, log=ctx.log_path(f"pooler-{tag}-{n}")) for n in range(settings[0])]
        try:
            result = drain(_Remaining(queue, jobs), jobs, procs, timeout=sizes.drain_timeout)
        finally:
            stop(procs)
        if not result.complete:
            ctx.progress("pooler", f"{side}: the drain did not finish\n{log_tail(ctx.log_path(f'pooler-{tag}-0'), 8)}")
            return None
        rates[side].append(result.steady_per_s)
        return result.steady_per_s

    for pair in range(sizes.tracing_pairs):
        sides = ["direct", "pooled"] if pair % 2 == 0 else ["pooled", "direct"]
        got = {side: one(side, f"{pair}-{side}") for side in sides}
        loads.append(_load())
        if got["direct"] and got["pooled"]:
            ratios.append(got["pooled"] / got["direct"])
            ctx.progress(
                "pooler",
                f"pair {pair + 1} ({sides[0]} first), load {loads[-1]}: direct {got['direct']:,.0f} jobs/s,"
                f" behind PgBouncer {got['pooled']:,.0f} jobs/s: ratio {ratios[-1]:.2f}",
            )
    _clear_queue(queue)
    note = f"{describe(settings)}; PgBouncer transaction mode, pool {POOL_SIZE}"
    detail = {"pairs": sizes.tracing_pairs, "loads": loads, "rates": rates}
    for side, label in (("direct", "direct"), ("pooled", "behind PgBouncer")):
        value = statistics.median(rates[side]) if rates[side] else None
        results.add(Figure(f"pooler.e2e_{side}", f"end-to-end no-op, {label} (median)", value, "jobs/s", note, detail))
    results.add(
        Figure(
            "pooler.e2e_ratio",
            "behind PgBouncer / direct, end to end, median of pairs",
            statistics.median(ratios) if ratios else None,
            "x",
            f"goal >= 0.8; loads {loads[0]} .. {loads[-1]}",
            {"ratios": [round(r, 3) for r in ratios], **detail},
        )
    )


def _latencies(
    ctx: BenchContext,
    sizes: Sizes,
    results: Results,
    db: str,
    settings: WorkerSettings,
    host: str,
    port: int,
    pooled_env: dict[str, str],
) -> None:
    """Idle enqueue-to-start, one worker process of the chosen settings: direct, behind PgBouncer listening past
    it, behind PgBouncer polling."""
    one_host = (1, *settings[1:])
    polling_env = {k: v for k, v in pooled_env.items() if k != "JOBSITE_LISTEN_DATABASE_URL"}
    modes = (
        ("direct", "direct", {}, ALIAS),
        ("listen", "behind PgBouncer, LISTEN past it", pooled_env, POOLED_ALIAS),
        ("poll", f"behind PgBouncer, polling every {POLL_INTERVAL:g} s", polling_env, POOLED_ALIAS),
    )
    for key, label, env, using in modes:
        extra = ["--poll-interval", str(POLL_INTERVAL)] if key == "poll" else []
        try:
            if using == POOLED_ALIAS:
                with _pooled_here(host, port):
                    figures = measure_latency(ctx, sizes, db, one_host, worker_env=env, worker_extra=extra, using=using)
            else:
                figures = measure_latency(ctx, sizes, db, one_host, worker_env=env, worker_extra=extra, using=using)
        except RuntimeError as exc:
            ctx.progress("pooler", f"idle latency {label}: {exc}")
            results.add(Figure(f"pooler.latency_{key}_p50", f"idle enqueue-to-start, {label} p50", None, "ms", "n/a"))
            continue
        for figure, q in zip(figures, ("p50", "p99"), strict=True):
            results.add(
                replace(
                    figure,
                    key=f"pooler.latency_{key}_{q}",
                    label=f"idle enqueue-to-start, {label} {q}",
                    note=describe(one_host),
                )  # fmt: skip
            )
