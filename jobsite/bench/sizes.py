"""How big a bench run is: `--quick` for a CI smoke run (about a minute without peers), `--full` for the
README's figures (the default), `--smoke` for the test suite (every part once, at the smallest sizes that still
exercise it; its figures mean nothing)."""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Sizes:
    name: str
    # ceiling: seconds per pgbench run, client counts tried (the best is kept)
    ceiling_seconds: int
    ceiling_clients: tuple[int, ...]
    # jobsite
    enqueue_rows: int
    e2e_jobs: int
    # (run_worker processes, pool, concurrency, batch, prefetch) tried for the worker host
    e2e_grid: tuple[tuple[int, str, int, int, int], ...]
    latency_samples: int
    admin_requests: int
    # peers: jobs in the first try, and how many of each peer's variants are tried (in the order listed)
    peer_jobs: int
    peer_variants: int
    drain_timeout: float
    # A drain should last about this long; one much shorter is run again with a backlog scaled to the speed
    # seen (at most `most_jobs`), so fast queues are not measured on a fraction of a second.
    drain_seconds: float
    most_jobs: int
    # flow control (bench/flow_control.py): items leased in process per variant, the rate limit (N, period in
    # seconds) held by four workers over three whole windows, the fair queue's (big key, small key) items
    # peers: enqueue-to-start side by side, jobsite's and each peer's at this load (items/s), or at half the
    # slowest throughput of the run when that is lower (peers.common_load); latency_samples probes each
    peer_latency_load: float = 500.0
    flow_lease_items: int = 20_000
    flow_rate: tuple[int, int] = (20, 2)
    flow_fair: tuple[int, int] = (10_000, 100)
    # workflow: steps of the fan-out (per-step cost), small fan-out/fan-in workflows timed for the fan-in delay
    workflow_steps: int = 10_000
    workflow_delay_samples: int = 100
    workflow_delay_fan: int = 10
    # waits (bench/waits_side.py): plain no-op items drained with and without `waits_present` sleeping or
    # waiting workflows, event -> next step samples, events sent by batch
    waits_noop: int = 20_000
    waits_present: int = 100_000
    waits_latency_samples: int = 200
    waits_batch: int = 50_000
    # tracing: off/on pairs for each sampled variant (100 %, 1 %); the figures are the medians of the pairs
    tracing_pairs: int = 5
    # jobsite's statement alone (jobsite_side.measure_statement): items a drain (10 batches of 1,000 at the
    # least, the smoke size's) and drains per variant, the best kept
    statement_jobs: int = 50_000
    statement_rounds: int = 2
    # the latency split (bench/split_side.py): the workers of each pool measured, idle and at this steady load (the
    # common load of the peers' side by side in issue 47's run), latency_samples probes each
    split_workers: tuple[tuple[int, str, int, int, int], ...] = (
        (2, "thread", 32, 500, 500),
        (1, "process", 4, 100, 100),
    )
    split_load: float = 180.0


QUICK = Sizes(
    name="quick",
    ceiling_seconds=2,
    ceiling_clients=(2, 4),
    enqueue_rows=20_000,
    e2e_jobs=5_000,
    e2e_grid=((1, "process", 8, 100, 100), (1, "thread", 32, 500, 500), (2, "thread", 16, 250, 250)),
    latency_samples=40,
    admin_requests=10,
    peer_jobs=1_000,
    peer_variants=2,
    drain_timeout=120.0,
    drain_seconds=4.0,
    most_jobs=50_000,
    flow_lease_items=20_000,
    flow_rate=(20, 2),
    flow_fair=(10_000, 100),
    workflow_steps=2_000,
    tracing_pairs=3,
    workflow_delay_samples=20,
    waits_noop=5_000,
    waits_present=2_000,
    waits_latency_samples=20,
    waits_batch=5_000,
)

FULL = Sizes(
    name="full",
    ceiling_seconds=10,
    ceiling_clients=(1, 2, 4, 8, 16),
    enqueue_rows=500_000,
    e2e_jobs=10_000,
    e2e_grid=(
        (1, "process", 4, 100, 100),
        (1, "process", 8, 200, 200),
        (2, "process", 8, 200, 200),
        (1, "thread", 32, 500, 500),
        (1, "thread", 32, 1000, 1000),
        (1, "thread", 64, 1000, 1000),
        (2, "thread", 32, 500, 500),
        (3, "thread", 16, 250, 250),
        (4, "thread", 16, 250, 250),
    ),
    latency_samples=400,
    admin_requests=50,
    peer_jobs=3_000,
    peer_variants=99,
    drain_timeout=600.0,
    drain_seconds=20.0,
    most_jobs=500_000,
    flow_lease_items=100_000,
    flow_rate=(100, 60),  # the goal: 100 a minute, three whole minutes
    flow_fair=(100_000, 100),
)

SIZES = {s.name: s for s in (QUICK, FULL)}

# The test suite's run of every part (tests/project/processes/test_bench_quick.py): each part's code path once, quickly.
SMOKE = replace(
    QUICK,
    name="smoke",
    ceiling_seconds=1,
    ceiling_clients=(2,),
    enqueue_rows=5_000,
    e2e_jobs=2_000,
    e2e_grid=((1, "thread", 16, 250, 250),),
    latency_samples=10,
    peer_jobs=300,
    peer_variants=1,
    drain_seconds=0.1,
    most_jobs=2_000,
    flow_lease_items=5_000,
    flow_fair=(2_000, 50),
    workflow_steps=200,
    workflow_delay_samples=5,
    waits_noop=2_000,
    waits_present=200,
    waits_latency_samples=5,
    waits_batch=1_000,
    tracing_pairs=1,
    statement_jobs=10_000,
    statement_rounds=1,
)
