"""The chunked no-op the benchmark's workers load (`run_worker --import jobsite.bench.chunk_tasks`): tooling,
not product."""

from typing import Any

from queue_app.registry import ChunkItem, ChunkPolicy, job

CHUNK_SIZE = 100


@job("bench.chunk_noop", chunk=ChunkPolicy(size=CHUNK_SIZE, timeout=0.05))
def chunk_noop(items: list[ChunkItem]) -> Any:
    return None  # every item done
