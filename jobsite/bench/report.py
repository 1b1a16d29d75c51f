"""The bench's results: figures, the ratios between them, the issue's goals, the table and the JSON file.

Every figure of one run is compared only with figures of the same run (same machine, same server, same load),
so the ratios mean something even when the absolute numbers are noisy.
"""

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PEER_LABELS = {
    "procrastinate": "Procrastinate",
    "django_tasks_db": "django-tasks-db",
    "celery_redis": "Celery+Redis",
    "pgqueuer": "PgQueuer",
    "django_q2": "django-q2",
    "pg_floor": "PostgreSQL floor: psycopg",
}


@dataclass
class Figure:
    key: str
    label: str
    value: float | None
    unit: str
    note: str = ""  # the settings that won, or why there is no value ("n/a (run_worker missing)")
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Goal:
    name: str
    figure: str
    over: str | None  # None: compare the figure itself with `target`
    op: str  # ">=" or "<="
    target: float


GOALS = (
    Goal("end-to-end >= 40% of the batched ceiling", "jobsite.e2e", "ceiling.lease_batch", ">=", 0.40),
    Goal(
        "end-to-end >= 40% of the batched ceiling measured again after it",
        "jobsite.e2e",
        "ceiling.lease_batch_again",
        ">=",
        0.40,
    ),
    Goal("end-to-end >= 20x Procrastinate", "jobsite.e2e", "peer.procrastinate", ">=", 20.0),
    Goal("end-to-end >= 20x django-tasks-db", "jobsite.e2e", "peer.django_tasks_db", ">=", 20.0),
    Goal("end-to-end >= 5x Celery+Redis", "jobsite.e2e", "peer.celery_redis", ">=", 5.0),
    Goal("bulk enqueue >= 70% of the insert ceiling", "jobsite.enqueue", "ceiling.insert", ">=", 0.70),
    Goal("idle enqueue-to-start p50 <= 5 ms", "jobsite.latency_p50", None, "<=", 5.0),
    Goal("idle enqueue-to-start p99 <= 50 ms", "jobsite.latency_p99", None, "<=", 50.0),
    # The flow-control and scale issue's: the end-to-end share of the ceiling, and the tail under half that load.
    Goal("end-to-end >= 60% of the batched ceiling", "jobsite.e2e", "ceiling.lease_batch", ">=", 0.60),
    Goal("enqueue-to-start p99 <= 20 ms at 50% of end-to-end", "jobsite.latency_load_p99", None, "<=", 20.0),
    Goal("size (hot + history) after steady churn <= 1.1x the start", "churn.growth", None, "<=", 1.1),
    Goal("rate limit held within +/-1 lease per window over 3 windows", "flow.rate_error", None, "<=", 1.0),
    Goal("a small group key out within 1.5x its fair share of leases", "flow.fair_share", None, "<=", 1.5),
    Goal("workflow step <= 1.5x a plain item", "workflow.step_ms", "workflow.item_ms", "<=", 1.5),
    Goal(
        "sub-workflow step overhead <= 2x a task step",
        "workflow.sub_workflow_overhead_ms",
        "workflow.task_step_wf_ms",
        "<=",
        2.0,
    ),
    Goal("fan-in start delay p99 < 50 ms", "workflow.fan_in_p99", None, "<=", 50.0),
    Goal("mapped trigger delay p99 (7 partitions) <= 50 ms", "datasets.mapped_trigger_p99", None, "<=", 50.0),
    # Traces (issue 40): tracing on costs little (bench/tracing_side.py: the medians of off/on pairs of one run).
    Goal("tracing on, 100% sampled >= 0.9x tracing off", "tracing.ratio_100", None, ">=", 0.9),
    Goal("tracing on, 1% sampled >= 0.97x tracing off", "tracing.ratio_1", None, ">=", 0.97),
    # ... the same goals as the CPU an item costs the worker host (steadier on a loaded machine): 1/0.9, 1/0.97.
    Goal("worker CPU an item, 100% sampled <= 1.11x off", "tracing.cpu_ratio_100", None, "<=", 1.11),
    Goal("worker CPU an item, 1% sampled <= 1.03x off", "tracing.cpu_ratio_1", None, "<=", 1.03),
    # Behind a connection pooler (issue 46: bench/pooler_side.py, PgBouncer in transaction mode, one run).
    Goal("end-to-end behind PgBouncer >= 0.8x direct", "pooler.e2e_ratio", None, ">=", 0.8),
    Goal(
        "idle enqueue-to-start p50 behind PgBouncer (LISTEN past it) <= 2x direct",
        "pooler.latency_listen_p50",
        "pooler.latency_direct_p50",
        "<=",
        2.0,
    ),
    Goal(
        "idle enqueue-to-start p99 behind PgBouncer (LISTEN past it) <= 50 ms",
        "pooler.latency_listen_p99",
        None,
        "<=",
        50.0,
    ),
)

# Which ceiling a figure is measured against (jobs/s against the batched lease, rows/s against the insert).
CEILING_OF = {
    "jobsite.enqueue": "ceiling.insert",
    "jobsite.e2e": "ceiling.lease_batch",
    "jobsite.statement": "ceiling.lease_batch",
    "ceiling.lease_one": "ceiling.lease_batch",
    "ceiling.lease_batch_again": "ceiling.lease_batch",  # the machine's drift between the two measurements
    # jobsite's idle enqueue-to-start over the floor of the same path on bare PostgreSQL (bench/idle_floor.py)
    "jobsite.latency_p50": "ceiling.idle_start",
    # jobsite's half-load tail over the floor's at the same rate, same run (peers.floor_at_half_load)
    "jobsite.latency_load_p50": "ceiling.load_start_p50",
    "jobsite.latency_load_p99": "ceiling.load_start_p99",
    **{f"peer.{name}": "ceiling.lease_batch" for name in PEER_LABELS},
}
LATENCY_PREFIX = "latency."  # enqueue-to-start at the peers' common load: jobsite's and each peer's, p50 and p99
# Figures compared with each peer (jobs/s).
VERSUS_PEERS = ("ceiling.lease_one", "ceiling.lease_batch", "jobsite.e2e")


@dataclass
class Results:
    size: str
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    figures: dict[str, Figure] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)  # a part that raised: part, error, traceback

    def add(self, figure: Figure) -> Figure:
        self.figures[figure.key] = figure
        return figure

    def value(self, key: str) -> float | None:
        figure = self.figures.get(key)
        return figure.value if figure else None

    def ratio(self, key: str, over: str) -> float | None:
        a, b = self.value(key), self.value(over)
        return a / b if a is not None and b else None

    def goals(self) -> list[dict[str, Any]]:
        rows = []
        for goal in GOALS:
            if goal.figure not in self.figures:
                continue
            actual = self.ratio(goal.figure, goal.over) if goal.over else self.value(goal.figure)
            passed = None
            if actual is not None:
                passed = actual >= goal.target if goal.op == ">=" else actual <= goal.target
            rows.append({"goal": goal.name, "target": goal.target, "actual": _round(actual), "passed": passed})
        return rows

    def as_dict(self) -> dict[str, Any]:
        peers = [k for k in self.figures if k.startswith("peer.")]
        ratios: dict[str, dict[str, float | None]] = {}
        for key in self.figures:
            row = {}
            if key in CEILING_OF:
                row["ceiling"] = _round(self.ratio(key, CEILING_OF[key]))
            if key in VERSUS_PEERS:
                row.update({peer: _round(self.ratio(key, peer)) for peer in peers})
            if row:
                ratios[key] = row
        return {
            "schema": 1,
            "size": self.size,
            "started_at": self.started_at,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": self.machine,
            "figures": {k: asdict(f) for k, f in self.figures.items()},
            "ratios": ratios,
            "goals": self.goals(),
            "notes": self.notes,
            "failures": self.failures,
        }


def percentile(values: list[float], q: float) -> float:
    """The value at rank q (0..1) of `values`, nearest rank (no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def machine_info(server_version: str = "") -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "postgres": server_version,
        "host": platform.node(),
    }


def _round(x: float | None) -> float | None:
    if x is None:
        return None
    return round(x, 3) if abs(x) < 100 else round(x, 1)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3f}"


def _fmt_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def table(results: Results) -> str:
    """The figures as a text table: value, ratio to its ceiling, ratio to each peer; then the goals."""
    peers = [k for k in results.figures if k.startswith("peer.")]
    head = ["figure", "value", "unit", "vs ceiling", *(PEER_LABELS[p.split(".", 1)[1]] for p in peers), "settings"]
    rows = [head]
    for key, figure in results.figures.items():
        if key.startswith(LATENCY_PREFIX):
            continue  # side by side below
        ceiling = _fmt_ratio(results.ratio(key, CEILING_OF[key])) if key in CEILING_OF else ""
        versus = [_fmt_ratio(results.ratio(key, p)) if key in VERSUS_PEERS else "" for p in peers]
        value = _fmt(figure.value) if figure.value is not None else (figure.note or "n/a")
        note = figure.note if figure.value is not None else ""
        rows.append([figure.label, value, figure.unit, ceiling, *versus, note])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    right = {1, 3, *range(4, 4 + len(peers))}
    lines = []
    for n, row in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += latency_side_by_side(results)
    goals = results.goals()
    if goals:
        lines += ["", "goals (ratios from this run):"]
        for g in goals:
            mark = {True: "PASS", False: "FAIL", None: "n/a "}[g["passed"]]
            lines.append(f"  {mark}  {g['goal']}: {_fmt(g['actual'])}")
    for note in results.notes:
        lines.append(f"note: {note}")
    for failure in results.failures:
        lines += ["", f"FAILED part {failure['part']}: {failure['error']}", failure["traceback"]]
    return "\n".join(lines)


def latency_side_by_side(results: Results) -> list[str]:
    """jobsite's and each peer's enqueue-to-start at the same load, from the same run (`latency.<name>_p50/_p99`)."""
    names = list(
        dict.fromkeys(
            k[len(LATENCY_PREFIX) :].rsplit("_", 1)[0] for k in results.figures if k.startswith(LATENCY_PREFIX)
        )
    )
    if not names:
        return []
    loads = {f.detail.get("load_per_s") for k, f in results.figures.items() if k.startswith(LATENCY_PREFIX)} - {None}
    load = f"{max(loads):,.0f} items/s" if loads else "the common load"
    rows = [["", "p50 ms", "p99 ms", "settings"]]
    for name in names:
        p50, p99 = (results.figures.get(f"{LATENCY_PREFIX}{name}_{q}") for q in ("p50", "p99"))
        label = p50.label.removesuffix(" p50") if p50 else name
        if p50 is None or p50.value is None:
            rows.append([label, p50.note if p50 else "n/a", "", ""])
            continue
        rows.append([label, _fmt(p50.value), _fmt(p99.value) if p99 else "-", p50.note])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out = ["", f"enqueue-to-start side by side, each under a steady {load} (same run):"]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].rjust(widths[2]), row[3]]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


def write_json(results: Results, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results.as_dict(), indent=2) + "\n")
    return path


def default_json_path(var_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return var_dir / "bench" / f"{stamp}.json"
