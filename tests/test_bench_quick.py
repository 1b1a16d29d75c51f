"""`queue_bench --quick --only ceiling` as a smoke test: it runs pgbench against the same server, prints the
table and writes the JSON results. Structure only: the figures are not judged (the machine may be busy)."""

import json
import os

import pytest

from queue_app.bench import ceiling
from queue_app.bench.ceiling import find_pgbench
from queue_app.bench.context import BenchContext, Progress, server_from_django
from queue_app.bench.report import Figure, Results, table
from queue_app.bench.sizes import QUICK

pytestmark = pytest.mark.slow


@pytest.mark.skipif(find_pgbench() is None, reason="no pgbench on this machine")
def test_quick_ceiling_run_reports_positive_figures_and_writes_json(manage, tmp_path):
    out = tmp_path / "bench.json"
    proc = manage(
        "queue_bench",
        "--quick",
        "--only",
        "ceiling",
        "--json-out",
        str(out),
        "--db-prefix",
        f"test_bench_{os.getpid()}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    results = json.loads(out.read_text())
    figures = results["figures"]
    assert set(figures) == {"ceiling.lease_one", "ceiling.lease_batch", "ceiling.insert"}
    for figure in figures.values():
        assert figure["value"] > 0, figure
        assert figure["detail"]["tries"], figure
    assert results["size"] == "quick"
    assert results["ratios"]["ceiling.lease_one"]["ceiling"] > 0
    assert "ceiling: lease 100 + complete 100" in proc.stdout
    assert f"results written to {out}" in proc.stdout


@pytest.mark.skipif(find_pgbench() is None, reason="no pgbench on this machine")
def test_the_batched_ceiling_is_measured_again_and_the_goal_judged_against_both(tmp_path):
    """After the end-to-end the batched ceiling is measured once more at the client count that won; the table
    shows the drift between the two and judges the end-to-end goal against each."""
    ctx = BenchContext(
        server=server_from_django(),
        db_prefix=f"test_bench_again_{os.getpid()}",
        progress=Progress(lambda line: None),
        log_dir=tmp_path,
    )
    results = Results(size="quick")
    try:
        ceiling.run(ctx, QUICK, results)
        ceiling.measure_again(ctx, QUICK, results)
    finally:
        ctx.drop_databases()
    first, again = results.figures["ceiling.lease_batch"], results.figures[ceiling.BATCH_AGAIN]
    winner = max(first.detail["tries"], key=lambda t: t["per_s"])["clients"]
    assert [t["clients"] for t in again.detail["tries"]] == [winner] and again.value > 0
    # 0.41 of the lower of the two ceilings: at most 0.41 of either, whatever the drift between them (CI once saw
    # the second 1.5x the first, and 0.41 of the second was 0.61 of the first).
    e2e = 0.41 * min(first.value, again.value)
    results.add(Figure("jobsite.e2e", "jobsite: end-to-end", e2e, "jobs/s"))
    judged = {g["goal"]: g["actual"] for g in results.goals()}
    assert judged["end-to-end >= 40% of the batched ceiling measured again after it"] == round(e2e / again.value, 3)
    assert judged["end-to-end >= 40% of the batched ceiling"] == round(e2e / first.value, 3)
    assert "again after the end-to-end" in table(results)
    # The flow-control issue's bar, on the same figures: at most 0.41 of the ceiling is not 0.6 ...
    sixty = next(g for g in results.goals() if g["goal"] == "end-to-end >= 60% of the batched ceiling")
    assert sixty["actual"] == judged["end-to-end >= 40% of the batched ceiling"] and sixty["passed"] is False
    # ... and 0.61 of the higher one is.
    results.add(Figure("jobsite.e2e", "jobsite: end-to-end", 0.61 * max(first.value, again.value), "jobs/s"))
    sixty = next(g for g in results.goals() if g["goal"] == "end-to-end >= 60% of the batched ceiling")
    assert sixty["actual"] >= 0.61 and sixty["passed"] is True


def test_quick_jobsite_run_measures_enqueue_end_to_end_and_latency_idle_and_under_load(manage, tmp_path):
    out = tmp_path / "bench.json"
    proc = manage(
        "queue_bench", "--quick", "--only", "jobsite", "--json-out", str(out),
        "--db-prefix", f"test_bench_{os.getpid()}", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr

    figures = json.loads(out.read_text())["figures"]
    for key in ("jobsite.enqueue", "jobsite.e2e"):
        assert figures[key]["value"] > 0, figures[key]
    e2e = figures["jobsite.e2e"]
    assert "--prefetch" in e2e["note"] and all(t["done"] == t["jobs"] for t in e2e["detail"]["tries"][-1:])
    latency = [f"jobsite.latency{suffix}_{q}" for suffix in ("", "_load", "_quarter") for q in ("p50", "p99")]
    for key in latency:
        assert figures[key]["value"] > 0, figures[key]
        assert figures[key]["detail"]["samples"] > 0
        detail = figures[key]["detail"]
        assert 0 <= detail["to_lease_p50_ms"] <= detail["to_lease_p99_ms"]  # the split of where the time went
        assert 0 <= detail["lease_to_start_p50_ms"] <= detail["lease_to_start_p99_ms"]
    assert figures["jobsite.latency_p50"]["value"] <= figures["jobsite.latency_p99"]["value"]
    for suffix, share in (("_load", "50%"), ("_quarter", "25%")):  # the steady loads (a process of their own) ran
        assert figures[f"jobsite.latency{suffix}_p50"]["detail"]["fed"] > 0
        assert figures[f"jobsite.latency{suffix}_p99"]["note"] == f"load {share} of end-to-end"
    # jobsite's statement alone (no worker): what one leasing connection does, the end-to-end figure's reference
    statement = figures["jobsite.statement"]
    assert statement["value"] > 0 and "connection(s)" in statement["note"], statement


def test_webhook_bench_reports_deliveries_per_second_and_latency(manage):
    proc = manage(
        "webhook_bench", "--quick", "--events", "100", "--samples", "5", "--db-prefix", f"test_bench_{os.getpid()}",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "100 deliveries in" in proc.stdout and "deliveries/s" in proc.stdout
    assert "latency event -> delivery (idle queue, 5 samples): p50" in proc.stdout


@pytest.mark.django_db(transaction=True)
def test_the_end_to_end_drain_follows_leases_by_the_sequence_then_counts_the_open_items(monkeypatch):
    """The drain's sample reads no table while jobs are still to lease (a count of the open items every 0.1 s
    took a third of the rate it measured); once all are leased it counts the open ones, so the drain ends on the
    last one done, not on the last lease."""
    from queue_app import engine
    from queue_app.bench import jobsite_side

    monkeypatch.setattr(jobsite_side, "ALIAS", "default")  # the test database, not a scratch one
    engine.lease(["e2e"], 1, "before", 60)  # an earlier drain's sequence values do not count
    engine.enqueue_many("queue_app.noop", [{}] * 10, queue="e2e")
    remaining = jobsite_side._Remaining("e2e", 10)
    assert remaining() == 10
    first = engine.lease(["e2e"], 4, "w", 60)
    assert remaining() == 6
    rest = engine.lease(["e2e"], 10, "w", 60)
    assert len(first) + len(rest) == 10
    assert remaining() == 10  # all leased, none done: now the open items are counted
    engine.settle_and_lease([(lease, None) for lease in first + rest[:3]], ["e2e"], 0, "w")
    assert remaining() == 3
    engine.settle_and_lease([(lease, None) for lease in rest[3:]], ["e2e"], 0, "w")
    assert remaining() == 0
