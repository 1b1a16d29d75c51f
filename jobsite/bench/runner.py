"""One bench run: the parts asked for, in order, on scratch databases that are dropped at the end; then the
table and the JSON file."""

import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from queue_app.conf import var_dir as conf_var_dir

from . import (
    ceiling,
    churn,
    datasets_side,
    flow_control,
    jobsite_side,
    peers,
    pooler_side,
    split_side,
    tracing_side,
    waits_side,
    workflow_side,
)
from .context import BenchContext, Progress, server_from_django
from .report import Results, default_json_path, machine_info, table, write_json
from .sizes import Sizes

PARTS = ("ceiling", "jobsite", "split", "flow", "peers", "workflow", "waits", "datasets", "tracing", "pooler")
TRACEBACK_FRAMES = 4  # the innermost frames of a failed part's traceback kept in the report


def run_part(ctx: BenchContext, results: Results, part: str, step: Callable[[], None]) -> None:
    """Run one part; one that raises is reported (its name, the error, the innermost frames of its traceback: in
    the progress lines, the table and the JSON) and the next part runs. The command exits 1 at the end."""
    try:
        step()
    except Exception as exc:  # any failure of a part is reported; the others still run
        summary = "".join(traceback.format_exception(exc, limit=-TRACEBACK_FRAMES)).rstrip()
        results.failures.append({"part": part, "error": f"{type(exc).__name__}: {exc}", "traceback": summary})
        ctx.progress(part, f"FAILED, going on with the other parts:\n{summary}")


def var_dir() -> Path:
    return conf_var_dir()


def run_bench(
    *,
    sizes: Sizes,
    parts: Sequence[str],
    peer_names: Sequence[str],
    churn_minutes: float | None,
    churn_rate: int = 1_400,
    json_out: Path | None,
    db_prefix: str,
    keep_databases: bool,
    write: Callable[[str], None],
    pooler_dsn: str | None = None,
) -> tuple[Results, Path]:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    ctx = BenchContext(
        server=server_from_django(),
        db_prefix=db_prefix,
        progress=Progress(write),
        log_dir=var_dir() / "bench" / "logs" / stamp,
        keep_databases=keep_databases,
        pooler_dsn=pooler_dsn,
    )
    with ctx.server.connect("postgres") as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    results = Results(size=sizes.name, machine=machine_info(version))
    load = results.machine["load_average"][0]
    cpus = results.machine["cpus"] or 1
    if load > 0.5 * cpus:
        results.notes.append(
            f"load average {load:.2f} on {cpus} cpus at start: absolute figures are noisy, compare ratios"
        )
    ctx.progress("bench", f"{sizes.name} run of {', '.join(parts) or 'nothing'} on PostgreSQL {version}")
    steps: dict[str, Callable[[], None]] = {
        "ceiling": lambda: ceiling.run(ctx, sizes, results),
        "jobsite": lambda: jobsite_side.run(ctx, sizes, results),
        "split": lambda: split_side.run(ctx, sizes, results),
        "flow": lambda: flow_control.run(ctx, sizes, results),
        "peers": lambda: peers.run(ctx, sizes, results, peer_names),
        "workflow": lambda: workflow_side.run(ctx, sizes, results),
        "waits": lambda: waits_side.run(ctx, sizes, results),
        "datasets": lambda: datasets_side.run(ctx, sizes, results),
        "tracing": lambda: tracing_side.run(ctx, sizes, results),
        "pooler": lambda: pooler_side.run(ctx, sizes, results),
        "churn": lambda: churn.run(ctx, results, minutes=churn_minutes, rate=churn_rate),
    }
    todo = [part for part in PARTS if part in parts] + (["churn"] if churn_minutes else [])
    try:
        for part in todo:
            run_part(ctx, results, part, steps[part])
    finally:
        ctx.drop_databases()
    if ctx.log_dir.exists():
        results.notes.append(f"child process logs: {ctx.log_dir}")
    path = write_json(results, json_out or default_json_path(var_dir()))
    write("")
    write(table(results))
    write(f"\nresults written to {path}")
    return results, path
