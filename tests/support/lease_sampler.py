"""A sampler of a queue's live leases, for tests that prove a limit with real workers: a limit is proved on the
leases themselves (what the database held at an instant), not on when handlers happened to start."""

import threading
from collections import Counter

from django.db import connection


class LiveReservations(threading.Thread):
    """A sampler on its own connection: the queue's live reservations (leased, not yet settled), per group key.
    Each sample is one statement, so one snapshot: what the database held at one instant. It samples as often as
    it can until stopped."""

    SAMPLE = """SELECT COALESCE(i.group_key, ''), count(*)
                FROM queue_app_reservation r JOIN queue_app_queueitem i ON i.id = r.item_id
                WHERE r.finished_at IS NULL AND i.queue_id = %s GROUP BY 1"""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.stopped = threading.Event()
        self.most_per_key: Counter[str] = Counter()
        self.most = self.samples = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connection.cursor() as cur:
                while not self.stopped.is_set():
                    cur.execute(self.SAMPLE, [self.queue])
                    counts = dict(cur.fetchall())
                    for key, live in counts.items():
                        self.most_per_key[key] = max(self.most_per_key[key], live)
                    self.most = max(self.most, sum(counts.values()))
                    self.samples += 1
        except BaseException as exc:  # reported by stop(), in the test's thread
            self.error = exc
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)
        assert self.error is None, self.error
