"""The workflow figures, in a scratch database of their own, with one worker host (fixed settings):

- per-step cost against a plain item, measured in the same run: N plain `queue_app.noop` items from their enqueue
  (one COPY) to the last one done, then a workflow `bench.fan_out` -> N noop steps (added, and so enqueued, by the
  running first step) -> one noop fan-in step, from its start to its end; cost = seconds per step over seconds
  per plain item (goal: at most 1.5). Both sides count the enqueue of their items: until session 11 the plain
  side did not (its items were queued before the clock started), the workflow side did (its fan-out);
- fan-in start delay: small fan-out/fan-in workflows run one after another; for each, the fan-in item's lease
  (its reservation's reserved_at) minus the settle of the last fan-out step (its finished_at), both the
  server's clock; p50 and p99 (goal: p99 under 50 ms on an idle machine). The reservation is read hot and archived
  alike (queue_app_reservation_all): the workers' archiver may have moved the finished fan-in item;
- the settle cost of conditions (bench/workflow_conditions.py), before the worker starts;
- a sub-workflow step's overhead against a task step's (bench/workflow_children.py).
"""

import time

from django.db import connections

from queue_app import engine
from queue_app.conf import queue_settings

from .context import BenchContext, django_child_env, log_tail, manage_args, spawn, stop, wait_until
from .jobsite_side import ALIAS, NOOP_TASK, _clear_queue, _scalar, bench_database
from .report import Figure, Results, percentile
from .sizes import Sizes
from .workflow_children import run as _children
from .workflow_conditions import run as _conditions
from .workflow_tasks import fan_out as _fan_out  # noqa: F401  registers bench.fan_out here too

WORKER = ("run_worker", "--pool", "thread", "--concurrency", "32", "--batch", "500", "--prefetch", "500")
ROUNDS = 3
SETTINGS = "1 x --pool thread --concurrency 32 --batch 500 --prefetch 500"


def _start_fan(n: int) -> int:
    from queue_app.workflows.definition import Graph
    from queue_app.workflows.services import start_graph

    graph = Graph("bench fan-out")
    first = graph.task("bench.fan_out", {"n": n}, name="fan_out")
    graph.task(NOOP_TASK, name="fan_in", after=[first])
    return start_graph(graph, started_by="queue_bench", using=ALIAS).id


def _state(workflow_id: int) -> str:
    return _scalar("SELECT state FROM queue_app_workflow WHERE id = %(id)s", {"id": workflow_id})


FAN_IN_DELAY = """
SELECT extract(epoch FROM r.reserved_at - (
           SELECT max(s.finished_at) FROM queue_app_workflowstep s
           WHERE s.workflow_id = j.workflow_id AND s."group" = 'noop'))
FROM queue_app_workflowstep j JOIN queue_app_reservation_all r ON r.item_id = j.item_id
WHERE j.workflow_id = %(id)s AND j.name = 'fan_in'
ORDER BY r.id LIMIT 1
"""


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    with bench_database(ctx, "workflow") as db:
        _conditions(ctx, sizes, results)  # settled in this process, before the worker starts
        env = django_child_env(db)
        procs = [
            spawn(
                manage_args(*WORKER, "--import", "jobsite.bench.workflow_tasks", "--no-scheduler"),
                env=env,
                log=ctx.log_path("workflow-worker"),
            )
        ]
        queue = queue_settings.DEFAULT_QUEUE
        try:
            n = sizes.workflow_steps
            plain_s, wf_s = [], []
            # Interleaved, the best of three each: this VM's speed drifts, and the first round also pays for the
            # worker's own start (its first plain round ran at half the speed of the next ones).
            for round_ in range(ROUNDS):
                _clear_queue(queue)
                t0 = time.perf_counter()
                engine.enqueue_many(NOOP_TASK, [{} for _ in range(n)], queue=queue, using=ALIAS)
                enqueued = time.perf_counter() - t0
                t = enqueued + wait_until(
                    lambda: (
                        not _scalar(
                            "SELECT count(*) FROM queue_app_queueitem WHERE queue_id = %(q)s AND state <> 'done'",
                            {"q": queue},
                        )
                    ),
                    600,
                    "plain items",
                    procs,
                )
                plain_s.append(t)
                ctx.progress("workflow", f"round {round_ + 1}: {n:,} plain items in {t:.2f}s = {n / t:,.0f}/s")
                workflow_id = _start_fan(n)
                t = wait_until(
                    lambda workflow_id=workflow_id: _state(workflow_id) == "succeeded", 600, "fan-out workflow", procs
                )
                wf_s.append(t)
                ctx.progress(
                    "workflow",
                    f"round {round_ + 1}: {n + 2:,}-step fan-out/fan-in in {t:.2f}s = {(n + 2) / t:,.0f} steps/s",
                )
            per_item, per_step = min(plain_s) / n, min(wf_s) / (n + 2)
            results.add(Figure("workflow.item_ms", "plain item (same run)", per_item * 1000, "ms", note=SETTINGS))
            results.add(
                Figure(
                    "workflow.step_ms",
                    f"workflow step ({n:,}-step fan-out/fan-in)",
                    per_step * 1000,
                    "ms",
                    note=SETTINGS,
                    detail={"plain_seconds": plain_s, "workflow_seconds": wf_s, "steps": n + 2},
                )
            )
            delays = []
            for _ in range(sizes.workflow_delay_samples):
                workflow_id = _start_fan(sizes.workflow_delay_fan)
                wait_until(
                    lambda workflow_id=workflow_id: _state(workflow_id) == "succeeded",
                    60,
                    "small fan-out workflow",
                    procs,
                )
                delays.append(float(_scalar(FAN_IN_DELAY, {"id": workflow_id})) * 1000)
            detail = {"samples": len(delays), "fan_out": sizes.workflow_delay_fan}
            results.add(
                Figure("workflow.fan_in_p50", "fan-in start delay p50", percentile(delays, 0.5), "ms", detail=detail)
            )
            results.add(
                Figure("workflow.fan_in_p99", "fan-in start delay p99", percentile(delays, 0.99), "ms", detail=detail)
            )
            _children(ctx, sizes, results, procs)  # a sub-workflow step's overhead vs a task step's (issue 48)
            ctx.progress(
                "workflow",
                f"per step {per_step * 1000:.3f} ms vs per plain item {per_item * 1000:.3f} ms = "
                f"{per_step / per_item:.2f}x; fan-in delay p50 {percentile(delays, 0.5):.1f} ms, "
                f"p99 {percentile(delays, 0.99):.1f} ms",
            )
        except RuntimeError as exc:
            ctx.progress("workflow", f"{exc}\n{log_tail(ctx.log_path('workflow-worker'))}")
            results.add(Figure("workflow.step_ms", "workflow step", None, "ms", note=f"n/a ({exc})"))
        finally:
            stop(procs)
            connections[ALIAS].close()
