"""jobsite behind a real PgBouncer in transaction mode (JOBSITE["CONNECTION_POOLER"] = "transaction"), Debian's
package (installed like the suite's other system packages: jobsite/system_packages.py).

One PgBouncer for the module (jobsite/pgbouncer.py), on a free loopback port, in front of the test database's
server (DATABASE_URL's, or the embedded cluster's unix socket), with a small pool so that the workers'
transactions share server connections. Workers reach the database through it; their LISTEN connection
goes past it (LISTEN_DATABASE_URL), or, without one, they poll and say so. Afterwards the pooled server
connections hold nothing of jobsite's: no advisory lock, no prepared statement, no session setting, no LISTEN.
"""

from collections import Counter
from urllib.parse import urlencode

import psycopg
import pytest
from django.db import connection
from django.test import Client

from jobsite import pgbouncer as pgbouncer_tool
from jobsite import system_packages
from jobsite.ci import in_ci
from queue_app.models import ExecutionLog, QueueItem, Worker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = "queue_app.probe"
POOL_SIZE = 4  # server connections PgBouncer opens per database: fewer than the workers' client connections
POLL = 0.3
WORKERS = ("pgb0", "pgb1")


@pytest.fixture(scope="module")
def pgbouncer():
    """A PgBouncer in transaction mode in front of the server; yields its port. Skipped (failed under CI=true)
    when the package is missing and cannot be installed."""
    absent = system_packages.ensure(["pgbouncer"])
    if absent:
        why = f"missing system package {system_packages.describe(absent)}"
        if in_ci():
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    server = _server()
    try:
        bouncer = pgbouncer_tool.start(server["host"], server["port"], server["user"], pool_size=POOL_SIZE)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None
    yield bouncer.port
    bouncer.stop()


def _server() -> dict[str, str]:
    """Where the test database's server is: host (a name or, for the embedded cluster, its socket directory),
    port and user, as Django connects."""
    params = connection.get_connection_params()
    return {"host": params.get("host") or "127.0.0.1", "port": str(params.get("port") or 5432),
            "user": params.get("user") or "postgres"}  # fmt: skip


def _url(port: int | None = None) -> str:
    """The test database's URL, through PgBouncer (on loopback) when `port` is given, else straight to the server
    (a socket directory as libpq's `host` parameter)."""
    server, name = _server(), connection.settings_dict["NAME"]
    if port is not None:
        return f"postgres://{server['user']}@127.0.0.1:{port}/{name}"
    if server["host"].startswith("/"):
        return f"postgresql://{server['user']}@/{name}?{urlencode({'host': server['host'], 'port': server['port']})}"
    return f"postgres://{server['user']}@{server['host']}:{server['port']}/{name}"


def _server_connections_state(port: int) -> list[tuple]:
    """What each pooled server connection carries: POOL_SIZE client transactions open at once through PgBouncer
    each get a server connection of their own, so every one in the pool is looked at."""
    clients = [psycopg.connect(_url(port), autocommit=False, prepare_threshold=None) for _ in range(POOL_SIZE)]
    try:
        return [
            c.execute(
                "SELECT pg_backend_pid(), (SELECT array_agg(name::text) FROM pg_prepared_statements),"
                " current_setting('plan_cache_mode'), current_setting('jit'),"
                " (SELECT reset_val FROM pg_settings WHERE name = 'jit'),"
                " (SELECT array_agg(c) FROM pg_listening_channels() c)"
            ).fetchone()
            for c in clients
        ]
    finally:
        for c in clients:
            c.close()


def test_two_workers_behind_pgbouncer_run_a_stream_once_each_and_leave_no_session_state(pgbouncer, worker, manage):
    # ARCHIVE_AFTER: the finished items stay in the hot table to be counted, however slow the machine.
    pooled = {
        "DATABASE_URL": _url(pgbouncer),
        "JOBSITE_CONNECTION_POOLER": "transaction",
        "JOBSITE_ARCHIVE_AFTER": "3600",
    }
    listening = {**pooled, "JOBSITE_LISTEN_DATABASE_URL": _url()}
    procs = {
        name: worker(name, "--concurrency", "4", "--poll-interval", "30", env=listening) for name in ("pgb0", "pgb1")
    }
    procs["pgb-poll"] = worker("pgb-poll", "--concurrency", "2", "--poll-interval", str(POLL), env=pooled)
    wait_for(lambda: Worker.objects.filter(id__in=procs).count() == 3, timeout=60, what="the three workers up")

    # A stream through PgBouncer while they run: one item at a time (the statement that failed with psycopg's
    # prepared statements, "_pg3_0 already exists"), then in bulk.
    enqueue = (
        "from queue_app import engine\n"
        "for n in range(300):\n"
        f"    engine.enqueue({PROBE!r}, {{'n': n}})\n"
        f"engine.enqueue_many({PROBE!r}, [{{'n': 300 + n}} for n in range(300)])\n"
    )
    done = manage("shell", "-c", enqueue, env=pooled, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    wait_for(lambda: ExecutionLog.objects.count() >= 600, timeout=120, what="600 runs")

    rows = {w.id: w.stats for w in Worker.objects.filter(id__in=procs)}
    assert {name: (s["wakeup"], s["poll_interval"]) for name, s in rows.items()} == {
        "pgb0": ("listen", 30.0),
        "pgb1": ("listen", 30.0),
        "pgb-poll": ("poll", POLL),
    }
    with psycopg.connect(_url(), autocommit=True) as direct:  # the wake duty: a row, taken through LISTEN_DATABASE_URL
        wake = direct.execute("SELECT holder FROM queue_app_leader WHERE duty LIKE 'wake %%'").fetchall()
    assert len(wake) == 1 and wake[0][0] in WORKERS
    metrics = Client().get("/metrics").content.decode()
    assert 'jobsite_worker_wakeup{mode="poll",worker="pgb-poll"} 1.0' in metrics
    assert 'jobsite_worker_wakeup{mode="listen",worker="pgb0"} 1.0' in metrics
    assert f'jobsite_worker_poll_interval_seconds{{worker="pgb-poll"}} {POLL}' in metrics

    for proc in procs.values():
        proc.terminate()
    for proc in procs.values():
        assert proc.wait(30) == 0, proc.log.read_text()[-3000:]
    assert "wake-ups: polling every 0.3 s, not listening" in procs["pgb-poll"].log.read_text()
    assert "wake-ups by LISTEN on LISTEN_DATABASE_URL" in procs["pgb0"].log.read_text()

    runs = Counter(ExecutionLog.objects.values_list("item_id", flat=True))
    items = set(QueueItem.objects.values_list("id", flat=True))
    assert len(items) == 600 and set(runs) == items and set(runs.values()) == {1}  # none lost, none run twice
    assert not QueueItem.objects.exclude(state="done").exists()
    assert set(ExecutionLog.objects.values_list("worker_id", flat=True)) <= set(procs)

    # The pooled server connections, each: nothing jobsite left there.
    state = _server_connections_state(pgbouncer)
    for _pid, prepared, plan_mode, jit, default_jit, channels in state:
        assert (prepared, plan_mode, jit, channels) == (None, "auto", default_jit, None)
    pids = {row[0] for row in state}

    def left_on_the_server() -> tuple[list, set, list] | None:
        """Advisory locks in the test database, client backends PgBouncer's look left out, leader rows; None when
        all are empty (a worker's exiting backend may still show for a moment)."""
        with psycopg.connect(_url(), autocommit=True) as direct:
            locks = direct.execute(
                "SELECT l.pid, l.objid FROM pg_locks l WHERE l.locktype = 'advisory'"
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall()
            servers = {
                pid
                for (pid,) in direct.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND pid <> %s",
                    [connection.connection.info.backend_pid],
                ).fetchall()
            }
            leaders = direct.execute("SELECT duty, holder FROM queue_app_leader").fetchall()
        found = (locks, servers - pids, leaders)  # every server connection was looked at; no duty left held
        return None if found == ([], set(), []) else found

    try:
        wait_for(lambda: left_on_the_server() is None, timeout=15, what="nothing of jobsite's left on the server")
    except AssertionError:
        assert left_on_the_server() is None  # fails showing what was left
