"""Finished items with two attempts each, aged by an interval, and the archiver run until nothing moves: for the history
tests in process and with workers."""

from django.db import connection, transaction

from queue_app import engine


def age(ids: list[int], interval: str) -> None:
    """Make these items (and nothing else) look finished `interval` earlier."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE queue_app_queueitem SET finished_at = finished_at - interval '{interval}' WHERE id = ANY(%s)",
            [ids],
        )


def finished(n: int, queue: str = "default") -> list[int]:
    """n done items, each with two reservations (a failed attempt, then the completed one)."""
    ids = engine.enqueue_many("t", [{"n": i} for i in range(n)], queue=queue, max_attempts=3)
    for held in engine.lease([queue], n, "w1"):
        engine.fail(held, "boom", retry_in=0)
    for held in engine.lease([queue], n, "w1"):
        engine.complete(held, {"ok": held.item_id})
    return ids


def archive_all(grace: float = 60.0) -> int:
    moved = 0
    while True:
        with transaction.atomic():
            batch = engine.archive(1000, grace=grace)
        moved += batch
        if not batch:
            return moved
