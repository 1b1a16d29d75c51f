"""Each peer of `queue_bench` really runs: its jobs are queued with its own API, its own workers (real processes)
drain them on the same PostgreSQL, and the bench reports a positive figure with the settings that won, then
enqueue-to-start p50 and p99 under a steady load (the side-by-side latency's measure). One
variant each, a small backlog: a smoke test of the harness, not a measurement. The peers come with the dev
install (the `bench` extra); Celery's needs a Redis on 127.0.0.1:6379 (.ci/run starts one where none answers):
without it the test skips, which fails a CI run (tests/support/skip_guard.py)."""

import os
from dataclasses import replace

import pytest

from jobsite.bench import peers
from jobsite.bench.context import BenchContext, Progress, server_from_django
from jobsite.bench.report import Figure, Results, table
from jobsite.bench.sizes import QUICK

pytestmark = pytest.mark.slow

SMOKE = replace(
    QUICK, peer_jobs=300, peer_variants=1, drain_timeout=120.0, drain_seconds=0.1, most_jobs=300, latency_samples=10
)
SMOKE_LOAD = 20.0  # items/s: every peer sustains it on a busy 2-core machine


def _redis_answers() -> bool:
    try:
        import redis

        from jobsite.bench.peers.celery_redis import REDIS_URL

        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except Exception:
        return False


@pytest.mark.parametrize("name", sorted(peers.PEERS))
def test_peer_drains_its_backlog_with_its_own_workers(name, tmp_path):
    try:
        peer_class = peers.load(name)  # imports the peer's package, as the bench does
    except ImportError as exc:
        pytest.skip(f"{exc} (pip install -e '.[bench]')")
    if name == "celery_redis" and not _redis_answers():
        pytest.skip("no Redis answers on 127.0.0.1:6379")
    lines: list[str] = []
    ctx = BenchContext(
        server=server_from_django(),
        db_prefix=f"test_peer_{os.getpid()}",
        progress=Progress(lines.append),
        log_dir=tmp_path,
    )
    peer = peer_class(ctx)
    try:
        figure = peer.measure(SMOKE)
        left = peer.remaining()
        # Enqueue-to-start under a light steady load, with the variant tried (its workers kept running).
        p50, p99 = peer.measure_latency(peer.variants()[0], SMOKE_LOAD, SMOKE.latency_samples)
    finally:
        peer.teardown()
        ctx.drop_databases()
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("*.log"))
    assert figure.value is not None and figure.value > 0, "\n".join(lines) + "\n" + logs
    assert figure.note == peer.variants()[0].label
    assert figure.label.endswith(peer.version())
    [tried] = figure.detail["tries"]
    assert tried["jobs"] == SMOKE.peer_jobs and tried["done"] == SMOKE.peer_jobs
    assert left == 0
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("*latency*"))
    assert p50.key == f"latency.{name}_p50" and p99.key == f"latency.{name}_p99"
    assert 0 < p50.value <= p99.value, logs
    assert p50.detail["samples"] == SMOKE.latency_samples and p50.detail["load_per_s"] == SMOKE_LOAD
    assert p50.detail["fed"] > 0, p50.detail  # the steady load ran beside the probes


def test_the_floor_is_measured_at_jobsites_half_load_and_read_beside_it(tmp_path):
    """The floor (pg_floor) runs under the rate of jobsite's half-load figure of the same run: the tail that load
    leaves the shortest durable path, the figure jobsite's half-load p50 and p99 are read over."""
    ctx = BenchContext(
        server=server_from_django(), db_prefix=f"test_floor_{os.getpid()}", progress=Progress(print), log_dir=tmp_path
    )
    results = Results(size="smoke")
    detail = {"load_per_s": SMOKE_LOAD}
    results.add(Figure("jobsite.latency_load_p99", "jobsite: under load p99", 30.0, "ms", detail=detail))
    floor = peers.load(peers.FLOOR)(ctx)
    try:
        floor.setup()
        peers.floor_at_half_load(ctx, SMOKE, results, floor.variants()[0])
    finally:
        floor.teardown()
        ctx.drop_databases()
    p50, p99 = results.figures["ceiling.load_start_p50"], results.figures["ceiling.load_start_p99"]
    assert 0 < p50.value <= p99.value
    assert p99.detail["load_per_s"] == SMOKE_LOAD and p99.detail["samples"] == SMOKE.latency_samples
    assert p99.label == "floor: enqueue-to-start under a steady 20 items/s (bare psycopg), p99"
    assert results.ratio("jobsite.latency_load_p99", "ceiling.load_start_p99") == 30.0 / p99.value
    assert p99.label in table(results)  # in the figures, not the side by side at the common load


def test_without_a_half_load_figure_the_floor_is_not_measured_again(tmp_path):
    ctx = BenchContext(server=server_from_django(), db_prefix="unused", progress=Progress(print), log_dir=tmp_path)
    results = Results(size="smoke")
    results.add(Figure("jobsite.latency_load_p99", "jobsite: under load p99", None, "ms", note="n/a"))
    peers.floor_at_half_load(ctx, SMOKE, results, peers.load(peers.FLOOR)(ctx).variants()[0])
    assert "ceiling.load_start_p99" not in results.figures
