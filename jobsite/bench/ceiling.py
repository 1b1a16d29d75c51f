"""The ceiling: what any PostgreSQL queue can do on this machine, measured with pgbench and custom scripts on a
bare table of the same shape as queue_app_queueitem's hot columns (primary key and the partial fetch index, no
foreign keys, no other indexes, no reservations table).

Three workloads, each run at a few client counts keeping the best, in `-M prepared` mode (the fastest pgbench
offers): lease one item and complete it (two statements, as a worker does), lease 100 and complete 100, and a
1000-row multi-row INSERT. Lease rows are counted as items/s, the insert as rows/s.
"""

import os
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from . import idle_floor
from .context import BenchContext
from .report import Figure, Results
from .sizes import Sizes

TABLE = "bench_ceiling_queue"

CREATE_TABLE = f"""
CREATE TABLE {TABLE} (
    id bigserial PRIMARY KEY,
    queue_id varchar(100) NOT NULL,
    task varchar(200) NOT NULL,
    payload jsonb NOT NULL DEFAULT '{{}}',
    state varchar(10) NOT NULL DEFAULT 'ready',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    visible_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 5,
    result jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX {TABLE}_fetch ON {TABLE} (queue_id, priority DESC, visible_at, id)
    WHERE state IN ('ready', 'reserved');
"""

FILL = f"""
INSERT INTO {TABLE} (queue_id, task) SELECT 'default', 'queue_app.noop' FROM generate_series(1, %(n)s)
"""


def _lease_script(n: int) -> str:
    # pgbench needs one row from \gset; the aggregate gives one even when nothing was leased.
    return f"""WITH picked AS (
    SELECT id FROM {TABLE}
    WHERE state IN ('ready', 'reserved') AND queue_id = 'default' AND visible_at <= now()
    ORDER BY priority DESC, visible_at, id
    LIMIT {n}
    FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE {TABLE} q
    SET state = 'reserved', attempts = q.attempts + 1, visible_at = now() + interval '60 seconds',
        updated_at = now()
    FROM picked WHERE q.id = picked.id
    RETURNING q.id
)
SELECT coalesce(array_agg(id), '{{}}')::text AS ids FROM leased
\\gset
UPDATE {TABLE} SET state = 'done', result = 'null', finished_at = now(), updated_at = now()
WHERE id = ANY(:ids::bigint[]) AND state = 'reserved';
"""


def _insert_script(rows: int) -> str:
    values = ",\n".join(
        "('default', 'queue_app.noop', '{}', 'ready', 0, now(), now(), 0, 5, now(), now())" for _ in range(rows)
    )
    return (
        f"INSERT INTO {TABLE} (queue_id, task, payload, state, priority, run_at, visible_at, attempts,"
        f" max_attempts, created_at, updated_at) VALUES\n{values};\n"
    )


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    unit: str
    per_transaction: int
    script: str
    fill_per_second: int  # rows to queue per second of run, so the queue never runs dry (0: insert)


WORKLOADS = (
    Workload("ceiling.lease_one", "ceiling: lease 1 + complete 1", "items/s", 1, _lease_script(1), 10_000),
    Workload("ceiling.lease_batch", "ceiling: lease 100 + complete 100", "items/s", 100, _lease_script(100), 80_000),
    Workload("ceiling.insert", "ceiling: multi-row INSERT (1000/tx)", "rows/s", 1000, _insert_script(1000), 0),
)


def find_pgbench(server_major: int | None = None) -> Path | None:
    """pgbench of the server's major version if installed, else the embedded cluster's, else any."""
    candidates: list[Path] = []
    if os.environ.get("JOBSITE_PGBENCH"):
        candidates.append(Path(os.environ["JOBSITE_PGBENCH"]))
    if server_major:
        candidates.append(Path(f"/usr/lib/postgresql/{server_major}/bin/pgbench"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgserver._commands import POSTGRES_BIN_PATH

        candidates.append(Path(POSTGRES_BIN_PATH) / "pgbench")
    except ImportError:
        pass
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), key=lambda p: _major(p.parts[-3]))
    candidates += reversed(installed)
    if shutil.which("pgbench"):
        candidates.append(Path(shutil.which("pgbench")))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _major(text: str) -> int:
    return int(text) if text.isdigit() else 0


_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)
_FAILED = re.compile(r"number of failed transactions: (\d+)")


def run_pgbench(
    ctx: BenchContext, pgbench: Path, db: str, script: Path, clients: int, seconds: int
) -> tuple[float, int]:
    """One pgbench run; returns (transactions per second, failed transactions)."""
    threads = max(1, min(clients, os.cpu_count() or 1))
    cmd = [str(pgbench), "-n", "-M", "prepared", "-f", str(script), "-c", str(clients), "-j", str(threads)]
    cmd += ["-T", str(seconds), db]
    proc = subprocess.run(
        cmd, env={**os.environ, **ctx.server.libpq_env()}, capture_output=True, text=True, timeout=seconds + 120
    )
    match = _TPS.search(proc.stdout)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}")
    failed = _FAILED.search(proc.stdout)
    return float(match.group(1)), int(failed.group(1)) if failed else 0


def _measure(ctx: BenchContext, pgbench: Path, db: str, script: Path, load: Workload, sizes: Sizes) -> Figure:
    best: tuple[float, int] | None = None
    tries: list[dict] = []
    with ctx.server.connect(db) as conn:
        for clients in sizes.ceiling_clients:
            fill = load.fill_per_second * sizes.ceiling_seconds
            for _ in range(3):  # refill larger if the queue ran dry under this machine's speed
                conn.execute(f"TRUNCATE {TABLE}")
                if fill:
                    conn.execute(FILL, {"n": fill})
                conn.execute(f"VACUUM ANALYZE {TABLE}")
                tps, failed = run_pgbench(ctx, pgbench, db, script, clients, sizes.ceiling_seconds)
                left = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE state = 'ready'").fetchone()[0]
                if not fill or left >= load.per_transaction * clients * 2:
                    break
                fill *= 4
            per_s = tps * load.per_transaction
            tries.append({"clients": clients, "per_s": round(per_s, 1), "tps": round(tps, 2), "failed": failed})
            ctx.progress("ceiling", f"{load.label} -c {clients}: {per_s:,.0f} {load.unit}")
            if best is None or per_s > best[0]:
                best = (per_s, clients)
    assert best is not None
    return Figure(load.key, load.label, best[0], load.unit, note=f"pgbench -c {best[1]}", detail={"tries": tries})


def _run_workload(ctx: BenchContext, pgbench: Path, db: str, load: Workload, sizes: Sizes) -> Figure:
    with tempfile.TemporaryDirectory(prefix="jobsite-bench-") as tmp:
        script = Path(tmp) / f"{load.key.split('.', 1)[1]}.sql"
        script.write_text(load.script)
        return _measure(ctx, pgbench, db, script, load, sizes)


BATCH_AGAIN = "ceiling.lease_batch_again"


def measure_again(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    """The batched ceiling once more, at the client count that won, right after the end-to-end: this VM's speed
    drifts by tens of percent within minutes, and the end-to-end ratio is shown against both measurements."""
    first = results.figures.get("ceiling.lease_batch")
    pgbench = results.machine.get("pgbench")
    if first is None or first.value is None or not pgbench:
        return
    clients = max(first.detail["tries"], key=lambda t: t["per_s"])["clients"]
    load = next(w for w in WORKLOADS if w.key == first.key)
    again = _run_workload(ctx, Path(pgbench), ctx.db_name("ceiling"), load, replace(sizes, ceiling_clients=(clients,)))
    again.key, again.label = BATCH_AGAIN, f"{load.label}, again after the end-to-end"
    results.add(again)


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    db = ctx.fresh_database("ceiling")
    with ctx.server.connect(db) as conn:
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000
        conn.execute(CREATE_TABLE)
    idle_floor.run(ctx, sizes, results, db)  # the idle path's floor on this machine, before pgbench loads it
    pgbench = find_pgbench(major)
    if pgbench is None:
        for load in WORKLOADS:
            results.add(Figure(load.key, load.label, None, load.unit, note="n/a (pgbench not found)"))
        return
    results.machine["pgbench"] = str(pgbench)
    ctx.progress("ceiling", f"pgbench {pgbench}, {sizes.ceiling_seconds}s per run, clients {sizes.ceiling_clients}")
    for load in WORKLOADS:
        results.add(_run_workload(ctx, pgbench, db, load, sizes))
