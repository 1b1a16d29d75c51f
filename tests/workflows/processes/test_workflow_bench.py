"""`queue_bench --quick --only workflow` as a smoke test: a fan-out/fan-in workflow and plain items drained by
the same worker, per-step and per-item cost, the fan-in delay, and both goals judged. The figures are checked for
what they must be, not judged against the goals here (the machine may be busy)."""

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_quick_workflow_bench_measures_per_step_cost_and_fan_in_delay(manage, tmp_path):
    out = tmp_path / "bench.json"
    proc = manage(
        "queue_bench", "--quick", "--only", "workflow", "--json-out", str(out),
        "--db-prefix", f"test_wfbench_{os.getpid()}", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    figures = data["figures"]
    for key in (
        "workflow.item_ms",
        "workflow.step_ms",
        "workflow.fan_in_p50",
        "workflow.fan_in_p99",
        "workflow.ready_plain_ms",  # the settle cost of conditions (bench/workflow_conditions.py)
        "workflow.ready_conditions_ms",
        "workflow.ended_plain_ms",
        "workflow.ended_conditions_ms",
    ):
        assert figures[key]["value"] > 0, figures[key]
    assert figures["workflow.step_ms"]["detail"]["steps"] == 2_002
    assert figures["workflow.fan_in_p50"]["value"] <= figures["workflow.fan_in_p99"]["value"]
    goals = {g["goal"] for g in data["goals"]}
    assert {"workflow step <= 1.5x a plain item", "fan-in start delay p99 < 50 ms"} <= goals
