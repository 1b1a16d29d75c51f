"""`queue_bench --quick` as a smoke test: it runs pgbench against the same server, prints the table and writes the
JSON results. The figures are checked for what they must be (positive, p50 under p99, every item counted, the goals'
ratios taken from them), not judged against the goals (the machine may be busy). The run of every part has the
workers' archiver moving finished items to the history at once, so a part that read finished work from the hot
tables alone would fail; a part that fails is reported and the others still run."""

import json
import os
import re
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from jobsite.bench import ceiling, runner
from jobsite.bench.ceiling import find_pgbench
from jobsite.bench.context import BenchContext, Progress, server_from_django
from jobsite.bench.report import Figure, Results, _fmt, table
from jobsite.bench.sizes import QUICK, SMOKE

pytestmark = pytest.mark.slow


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


def test_webhook_bench_reports_deliveries_per_second_and_latency(manage):
    proc = manage(
        "webhook_bench", "--quick", "--events", "100", "--samples", "5", "--db-prefix", f"test_bench_{os.getpid()}",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The figures printed, read back and checked against each other (not only that a line was printed): the rate
    # is the 100 deliveries over the time printed, and the latency percentiles are real and ordered.
    rate = re.search(r"throughput: 100 deliveries in ([\d.]+) s = ([\d,]+) deliveries/s", proc.stdout)
    assert rate, proc.stdout
    took, per_s = float(rate[1]), float(rate[2].replace(",", ""))
    assert took > 0 and abs(per_s - 100 / took) <= max(1.0, 0.05 * per_s), (took, per_s)
    latency = re.search(
        r"latency event -> delivery \(idle queue, 5 samples\): p50 ([\d.]+) ms, p99 ([\d.]+) ms", proc.stdout
    )
    assert latency, proc.stdout
    assert 0 < float(latency[1]) <= float(latency[2]) < 30_000, latency.groups()  # each sample waits at most 30 s


@pytest.mark.django_db(transaction=True)
def test_the_end_to_end_drain_follows_leases_by_the_sequence_then_counts_the_open_items(monkeypatch):
    """The drain's sample reads no table while jobs are still to lease (a count of the open items every 0.1 s
    took a third of the rate it measured); once all are leased it counts the open ones, so the drain ends on the
    last one done, not on the last lease."""
    from jobsite.bench import jobsite_side
    from queue_app import engine

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


def test_every_part_reads_finished_work_across_the_archive(manage, tmp_path):
    """The quick run of every part (the ceiling's, jobsite's, flow control's, one peer's, the workflow's and the
    side-by-side latency's figures, checked for their structure), with the workers archiving finished items as
    soon as they are done (JOBSITE_ARCHIVE_AFTER=0; the archive unit runs every 2 s): the flow part's rate
    limit is measured over its whole windows, its fairness over every lease, the end-to-end drain counts every
    item done, the fan-in delay finds its reservation, though all of them are in the history by then (issue 37:
    `--full` died in the flow part, `max()` of no windows, after the archiver had moved them)."""
    out = tmp_path / "bench.json"
    proc = manage(
        "queue_bench", "--smoke", "--peers", "procrastinate", "--json-out", str(out),
        "--db-prefix", f"test_bench_archived_{os.getpid()}", timeout=1_500, env={"JOBSITE_ARCHIVE_AFTER": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["failures"] == [], data["failures"]
    figures = data["figures"]
    assert "FAILED" not in proc.stdout, proc.stdout
    assert proc.stdout.count("each part's scratch database is a copy of it") == 1, proc.stdout  # migrated once
    assert "maintenance unit=archive archived=" in "".join(
        p.read_text(errors="replace") for p in _logs_of(proc.stdout).glob("flow-rate-*.log")
    ), "the archiver did not move anything: this run proves nothing"
    for key in (
        "ceiling.lease_batch",
        "jobsite.e2e",
        "flow.fair_share",
        "peer.procrastinate",
        "workflow.fan_in_p99",
        "waits.event_p99",
    ):
        assert (figures[key]["value"] or 0) > 0, (figures[key], proc.stdout[-5000:])
    _check_ceiling(data, proc.stdout, out)
    _check_jobsite(figures)
    # Enqueue-to-start side by side: jobsite's and the peer's at one load, both measured in this run.
    for name in ("jobsite", "procrastinate"):
        p50, p99 = figures[f"latency.{name}_p50"], figures[f"latency.{name}_p99"]
        assert 0 < (p50["value"] or 0) <= (p99["value"] or 0), (p50, p99, proc.stdout[-5000:])
        assert p50["detail"]["samples"] == SMOKE.latency_samples and p50["detail"]["fed"] > 0, p50
    assert (
        figures["latency.jobsite_p50"]["detail"]["load_per_s"]
        == figures["latency.procrastinate_p50"]["detail"]["load_per_s"]
    )
    assert "enqueue-to-start side by side, each under a steady" in proc.stdout
    e2e = figures["jobsite.e2e"]["detail"]["tries"]
    assert all(t["done"] == t["jobs"] for t in e2e), e2e  # done counted in the history too
    rate = figures["flow.rate_error"]
    assert rate["value"] is not None and len(rate["detail"]["windows"]) == 3, rate
    assert all(n > 0 for n in rate["detail"]["windows"]), rate
    big, small = figures["flow.fair_share"]["detail"]["big"], figures["flow.fair_share"]["detail"]["small"]
    assert small <= figures["flow.fair_share"]["detail"]["position"] <= big + small
    # Tracing off, on at 100 % and at 1 % (a loopback receiver): spans arrived when on (at most one an attempt: the
    # export queue may drop some at full speed, counted), none when off.
    for key in ("tracing.off", "tracing.on_100", "tracing.on_1"):
        assert (figures[key]["value"] or 0) > 0, (figures[key], proc.stdout[-5000:])
    assert figures["tracing.off"]["detail"]["spans_received_last_round"] == 0
    assert 0 < figures["tracing.on_100"]["detail"]["spans_received_last_round"] <= SMOKE.e2e_jobs
    # Behind PgBouncer against direct (issue 46): both sides drained, and each mode's idle latency measured.
    for key in ("pooler.e2e_direct", "pooler.e2e_pooled", "pooler.e2e_ratio"):
        assert (figures[key]["value"] or 0) > 0, (figures[key], proc.stdout[-5000:])
    for mode in ("direct", "listen", "poll"):
        p50, p99 = figures[f"pooler.latency_{mode}_p50"], figures[f"pooler.latency_{mode}_p99"]
        assert 0 < (p50["value"] or 0) <= (p99["value"] or 0), (p50, p99)
    # The two goals judged on those figures: their actual ratio is the figure's, passed as it compares
    judged = {goal["goal"]: goal for goal in data["goals"]}
    for name, key in (
        ("tracing on, 100% sampled >= 0.9x tracing off", "tracing.ratio_100"),
        ("end-to-end behind PgBouncer >= 0.8x direct", "pooler.e2e_ratio"),
    ):
        goal, value = judged[name], figures[key]["value"]
        assert value > 0 and abs(goal["actual"] - value) < 0.001, (goal, figures[key])
        assert goal["passed"] == (goal["actual"] >= goal["target"]) and f"{name}: {_fmt(goal['actual'])}" in proc.stdout


def _check_ceiling(data: dict, stdout: str, out: Path) -> None:
    """pgbench ran against the same server: every workload positive, with its tries, ratios and the table."""
    measured = {k: f for k, f in data["figures"].items() if k.startswith("ceiling.")}
    pgbench = {"ceiling.lease_one", "ceiling.lease_batch", "ceiling.insert", ceiling.BATCH_AGAIN}
    floor = {"ceiling.idle_round_trip", "ceiling.idle_commit", "ceiling.idle_start"}  # bench/idle_floor.py
    assert set(measured) == pgbench | floor
    for key in pgbench:
        assert measured[key]["value"] > 0 and measured[key]["detail"]["tries"], measured[key]
    for key in floor:
        assert measured[key]["value"] > 0 and measured[key]["unit"] == "ms", measured[key]
    # jobsite's idle p50 beside that floor: the ratio the table prints.
    idle = data["figures"]["jobsite.latency_p50"]["value"]
    assert data["ratios"]["jobsite.latency_p50"]["ceiling"] == round(idle / measured["ceiling.idle_start"]["value"], 3)
    assert data["size"] == "smoke"
    assert data["ratios"]["ceiling.lease_one"]["ceiling"] > 0
    assert "ceiling: lease 100 + complete 100" in stdout
    assert f"results written to {out}" in stdout


def _check_jobsite(figures: dict) -> None:
    """Bulk enqueue, end to end, the statement alone, and enqueue-to-start idle and under two steady loads."""
    assert figures["jobsite.enqueue"]["value"] > 0, figures["jobsite.enqueue"]
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


def _logs_of(stdout: str):
    """The child processes' log directory a bench run names in its notes."""
    [line] = [line for line in stdout.splitlines() if line.startswith("note: child process logs: ")]
    return Path(line.removeprefix("note: child process logs: "))


def test_a_part_that_fails_is_reported_and_the_others_still_run(monkeypatch, tmp_path):
    """A broken part: its name, error and traceback in the table and the JSON, the parts after it run, and the
    command fails at the end (CommandError: exit 1)."""
    ran: list[str] = []

    def broken(ctx, sizes, results):
        raise ValueError("max() iterable argument is empty")

    monkeypatch.setattr(runner.flow_control, "run", broken)
    monkeypatch.setattr(runner.ceiling, "run", lambda ctx, sizes, results: ran.append("ceiling"))
    monkeypatch.setattr(runner.workflow_side, "run", lambda ctx, sizes, results: ran.append("workflow"))
    out = tmp_path / "bench.json"
    lines: list[str] = []
    results, _ = runner.run_bench(
        sizes=QUICK, parts=["ceiling", "flow", "workflow"], peer_names=[], churn_minutes=None, json_out=out,
        db_prefix=f"test_bench_fail_{os.getpid()}", keep_databases=False, write=lines.append,
    )  # fmt: skip
    assert ran == ["ceiling", "workflow"]
    [failure] = results.failures
    assert failure["part"] == "flow" and failure["error"] == "ValueError: max() iterable argument is empty"
    assert "in broken" in failure["traceback"]
    printed = "\n".join(lines)
    assert "FAILED part flow: ValueError: max() iterable argument is empty" in printed
    assert "flow      FAILED, going on with the other parts" in printed
    assert json.loads(out.read_text())["failures"] == results.failures

    with pytest.raises(CommandError, match=r"1 part\(s\) failed: flow \(ValueError"):
        call_command("queue_bench", "--quick", "--only", "flow,workflow", "--json-out", str(out))
    assert ran[-1] == "workflow"
