"""The workflow-waits figures (issue 39), `queue_bench --only waits`, in a scratch database of their own with one
worker host (the workflow part's settings):

- waiting workflows cost nothing: N plain `queue_app.noop` items drained with no waiting workflow present, then
  with `waits_present` workflows present (half asleep for a day in `wf.sleep`, half waiting a day for an event),
  then with none again (their delayed items deleted), best of ROUNDS each after a warm-up drain, same worker; the
  ratio of the throughputs (goal: within 5 %), and the reservations held and the database's connections with
  them present (goal: no more than with none);
- event -> next step: a workflow waiting for an event -> a noop step; `send_event`, then the noop step's item's
  lease (its reservation's reserved_at) minus the event's created_at, both the server's clock; p50 and p99 over
  `waits_latency_samples` workflows, one at a time (goal: p99 at most 50 ms on an idle machine);
- batch send: `waits.send_events` of `waits_batch` events in batches of BATCH, to keys no step waits for (stored,
  kept for the lookback), then to the present event waits (each ends one, whose workflow then succeeds); events
  accepted per second (goal: 5,000/s).
"""

import time

from django.db import connections

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.workflows import waits
from queue_app.workflows.definition import Graph
from queue_app.workflows.services import start_graph

from .context import BenchContext, django_child_env, log_tail, manage_args, spawn, stop, wait_until
from .jobsite_side import ALIAS, NOOP_TASK, _scalar, bench_database
from .report import Figure, Results, percentile
from .sizes import Sizes
from .workflow_side import SETTINGS, WORKER

ROUNDS = 2
BATCH = 1_000
EVENT = "bench.paid"
DAY = 86_400.0

OPEN_NOOPS = "SELECT count(*) FROM queue_app_queueitem WHERE task = %(t)s AND state <> 'done'"
CLEAR_NOOPS = "DELETE FROM queue_app_queueitem WHERE task = %(t)s AND state = 'done' AND workflow_step_id IS NULL"
# The present waits' delayed items (sleeps and event timeouts), deleted for the last rounds without them.
WAITS_GONE = "DELETE FROM queue_app_queueitem WHERE workflow_step_id IS NOT NULL AND state = 'ready'"
HELD = "SELECT count(*) FROM queue_app_queueitem WHERE state = 'reserved'"
CONNECTIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
LATENCY = """
SELECT extract(epoch FROM r.reserved_at - e.created_at)
FROM queue_app_workflowevent e
JOIN queue_app_workflowstep w ON w.id = e.step_id
JOIN queue_app_workflowstep n ON n.workflow_id = w.workflow_id AND n.name = 'next'
JOIN queue_app_reservation_all r ON r.item_id = n.item_id
WHERE e.id = %(id)s
ORDER BY r.id LIMIT 1
"""


def _drain(n: int, procs) -> float:
    with connections[ALIAS].cursor() as cur:
        cur.execute(CLEAR_NOOPS, {"t": NOOP_TASK})
    t0 = time.perf_counter()
    engine.enqueue_many(NOOP_TASK, [{} for _ in range(n)], queue=queue_settings.DEFAULT_QUEUE, using=ALIAS)
    enqueued = time.perf_counter() - t0
    return enqueued + wait_until(lambda: not _scalar(OPEN_NOOPS, {"t": NOOP_TASK}), 600, "plain items", procs)


def _plant_waits(n: int) -> None:
    """n workflows of one step each: half sleep a day, half wait a day for an event of their own key."""
    for i in range(n):
        g = Graph("bench waiting")
        if i % 2:
            g.sleep("nap", seconds=DAY)
        else:
            g.wait_event("paid", event=EVENT, key=f"present-{i}", timeout=DAY)
        start_graph(g, started_by="queue_bench", using=ALIAS)


def _latency(samples: int, procs) -> list[float]:
    delays = []
    for i in range(samples):
        g = Graph("bench event latency")
        paid = g.wait_event("paid", event=EVENT, key=f"latency-{i}", timeout=3600)
        g.task(NOOP_TASK, name="next", after=[paid])
        workflow_id = start_graph(g, started_by="queue_bench", using=ALIAS).id
        time.sleep(0.05)  # the worker idle again: the wake-up is measured, not a queue behind it
        sent = waits.send_event(EVENT, f"latency-{i}", {"i": i}, using=ALIAS)
        wait_until(
            lambda workflow_id=workflow_id: (
                _scalar("SELECT state FROM queue_app_workflow WHERE id = %(id)s", {"id": workflow_id}) == "succeeded"
            ),
            60,
            "event latency workflow",
            procs,
        )
        delays.append(float(_scalar(LATENCY, {"id": sent.id})) * 1000)
    return delays


def _batch_rate(events: list[tuple[str, str, None]]) -> float:
    t0 = time.perf_counter()
    for start in range(0, len(events), BATCH):
        waits.send_events(events[start : start + BATCH], using=ALIAS)
    return len(events) / (time.perf_counter() - t0)


def run(ctx: BenchContext, sizes: Sizes, results: Results) -> None:
    with bench_database(ctx, "waits") as db:
        procs = [
            spawn(
                manage_args(*WORKER, "--no-scheduler"),
                env=django_child_env(db),
                log=ctx.log_path("waits-worker"),
            )
        ]
        try:
            n, present = sizes.waits_noop, sizes.waits_present
            _drain(n, procs)  # warm-up, not counted: the first drain also pays for the worker's own start
            none_s = [_drain(n, procs) for _ in range(ROUNDS)]
            connections_none = _scalar(CONNECTIONS)
            ctx.progress("waits", f"{n:,} plain items, no waits: best {min(none_s):.2f}s = {n / min(none_s):,.0f}/s")
            t0 = time.perf_counter()
            _plant_waits(present)
            ctx.progress("waits", f"{present:,} waiting workflows started in {time.perf_counter() - t0:.1f}s")
            held, connections_present = _scalar(HELD), _scalar(CONNECTIONS)
            with_s = [_drain(n, procs) for _ in range(ROUNDS)]
            # Batch sends that each end one of the present event waits, before the waits' items are deleted.
            matched = _batch_rate([(EVENT, f"present-{i}", None) for i in range(0, present, 2)])
            with connections[ALIAS].cursor() as cur:
                cur.execute(WAITS_GONE)
            none_s += [_drain(n, procs) for _ in range(ROUNDS)]
            ratio = min(none_s) / min(with_s)
            detail = {"none_seconds": none_s, "present_seconds": with_s, "items": n, "present": present,
                      "reserved_while_waiting": held, "connections_none": connections_none,
                      "connections_present": connections_present}  # fmt: skip
            results.add(Figure("waits.noop_none", "plain no-op, no waits", n / min(none_s), "items/s", note=SETTINGS))
            results.add(Figure("waits.noop_present", f"plain no-op, {present:,} waiting", n / min(with_s), "items/s"))
            results.add(Figure("waits.throughput_ratio", "throughput with waits / without", ratio, "x", detail=detail))
            ctx.progress(
                "waits",
                f"with {present:,} waiting: best {min(with_s):.2f}s = {n / min(with_s):,.0f}/s (ratio {ratio:.3f}); "
                f"reserved {held}, connections {connections_present} (none: {connections_none})",
            )
            delays = _latency(sizes.waits_latency_samples, procs)
            detail = {"samples": len(delays)}
            results.add(Figure("waits.event_p50", "event -> next step started p50", percentile(delays, 0.5), "ms",
                               detail=detail))  # fmt: skip
            results.add(Figure("waits.event_p99", "event -> next step started p99", percentile(delays, 0.99), "ms",
                               detail=detail))  # fmt: skip
            ctx.progress(
                "waits",
                f"event -> next step p50 {percentile(delays, 0.5):.1f} ms, p99 {percentile(delays, 0.99):.1f} ms",
            )
            kept = _batch_rate([(EVENT, f"nobody-{i}", None) for i in range(sizes.waits_batch)])
            results.add(Figure("waits.batch_kept", f"send_events, batches of {BATCH:,}, kept", kept, "events/s",
                               detail={"events": sizes.waits_batch}))  # fmt: skip
            results.add(Figure("waits.batch_matched", f"send_events, batches of {BATCH:,}, each ends a wait",
                               matched, "events/s", detail={"events": (present + 1) // 2}))  # fmt: skip
            ctx.progress("waits", f"batch send: {kept:,.0f} events/s kept, {matched:,.0f} events/s ending waits")
        except RuntimeError as exc:
            ctx.progress("waits", f"{exc}\n{log_tail(ctx.log_path('waits-worker'))}")
            results.add(Figure("waits.throughput_ratio", "throughput with waits", None, "x", note=f"n/a ({exc})"))
        finally:
            stop(procs)
            connections[ALIAS].close()
