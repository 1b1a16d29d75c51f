"""Chunked tasks only the tests need (tests/core/processes/test_chunks.py). Workers load them with `--import
tests.tasks.chunk_tasks`."""

import time
from pathlib import Path

from queue_app.registry import ChunkItem, ChunkPolicy, Delivery, ItemDead, ItemRetry, Retry, job


def _outcomes(items: list[ChunkItem]) -> list:
    """Each item's outcome: `retry_once` fails its first attempt, `dead` goes to the dead letters; the others are
    done with the size of the chunk they ran in. `marker` (a path): touched when the chunk starts, then the
    handler sleeps `sleep` seconds (`sleep_first`: on the item's first attempt only)."""
    for item in items:
        if item.payload.get("marker"):
            Path(item.payload["marker"]).touch()
        time.sleep(item.payload.get("sleep", 0))
        if item.ctx.attempt == 1:
            time.sleep(item.payload.get("sleep_first", 0))
    out = []
    for item in items:
        if item.payload.get("retry_once") and item.ctx.attempt == 1:
            out.append(ItemRetry("failed on purpose, first attempt"))
        elif item.payload.get("dead"):
            out.append(ItemDead("cannot ever succeed"))
        else:
            out.append({"chunk": len(items), "attempt": item.ctx.attempt})
    return out


@job("tests.chunked", queue="chunks", chunk=ChunkPolicy(size=100, timeout=1.0), retry=Retry(times=3, delay=0))
def chunked(items: list[ChunkItem]) -> list:
    return _outcomes(items)


@job("tests.chunked_short", queue="chunks", chunk=ChunkPolicy(size=10, timeout=0.5), hard_timeout=3.0)
def chunked_short(items: list[ChunkItem]) -> list:
    return _outcomes(items)


@job(
    "tests.chunked_hard",
    queue="chunk_hard",
    chunk=ChunkPolicy(size=10, timeout=0.5),
    hard_timeout=2.0,
    retry=Retry(times=3, delay=0),
)
def chunked_hard(items: list[ChunkItem]) -> list:
    return _outcomes(items)


@job(
    "tests.chunked_at_most_once",
    queue="chunks",
    chunk=ChunkPolicy(size=10, timeout=0.5),
    delivery=Delivery.AT_MOST_ONCE,
    hard_timeout=3.0,
)
def chunked_at_most_once(items: list[ChunkItem]) -> list:
    return _outcomes(items)


@job("tests.chunked_raises", queue="chunk_fail", chunk=ChunkPolicy(size=10, timeout=0.1), retry=Retry(times=3, delay=0))
def chunked_raises(items: list[ChunkItem]) -> list:
    raise RuntimeError(f"the bulk call failed for {len(items)} items")


@job(
    "tests.chunked_miscount", queue="chunk_fail", chunk=ChunkPolicy(size=10, timeout=0.1), retry=Retry(times=3, delay=0)
)
def chunked_miscount(items: list[ChunkItem]) -> list:
    return [{"ok": True}] * (len(items) - 1)  # one outcome short


@job(
    "tests.chunked_bad_result",
    queue="chunk_fail",
    chunk=ChunkPolicy(size=10, timeout=0.1),
    retry=Retry(times=3, delay=0),
)
def chunked_bad_result(items: list[ChunkItem]) -> list:
    return [{"ok": True}, {1, 2}, *[None] * (len(items) - 2)]  # the second item's result is not JSON
