"""``manage.py admin_bench``'s benchmark: load a million queue items and time the admin's change lists on them.

Loads N items (default 1,000,000; ``--quick``: 50,000) spread over queues, tasks, states and a week of creation
times, with an attempt per started item and a dead letter per dead one (server-side INSERT ... SELECT
generate_series in batches, then VACUUM ANALYZE; ``--mix open``: 93% of them open, as in the hot table of the
partitioned layout), then requests the item and dead-letter change lists (plain,
filtered by queue / state / task / time, searched by id and keys, page 2) as a logged-in superuser through
Django's test client and prints p50 / p95 per view against the budget (300 ms). Exits 1 when a list misses it.

``--history N`` also loads N finished items (95% done, 5% cancelled) with a reservation each straight into the
partitioned history (engine/history.py), spread over the last ``--history-days`` days (set-based INSERT ...
SELECT generate_series into the day partitions), and times the history lists too. ``--throughput K`` measures
lease + settle of K no-op items (settle_and_lease batches of 1,000, in this process) before the history is
loaded and again after, in the same run, and prints the ratio: the hot path never reads the history tables.

``--datasets N`` (``--quick``: 1,000; the issue's size: 10,000) also declares N datasets and the Spark jobs between
them and loads ``--materializations M`` (default 100 per dataset) (bench/admin_datasets.py), and times the
Datasets list, a dataset's page and the lineage page of a 1,000-node neighbourhood.

Loading needs an empty queue (or ``--reset``, which deletes every queue row in the database: use a database of
its own). ``--reuse`` times what is already loaded.
"""

import math
import os
import statistics
import time

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client

from jobsite import serving
from jobsite.bench import admin_datasets
from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.models import (
    DeadLetter,
    IdMark,
    ItemHistory,
    Queue,
    QueueItem,
    Reservation,
    ReservationHistory,
    Worker,
)

QUEUES = 5
TASKS = 20
BATCH = 100_000
ITEMS = QueueItem._meta.db_table
RESERVATIONS = Reservation._meta.db_table
DEAD_LETTERS = DeadLetter._meta.db_table
ITEM_HISTORY = ItemHistory._meta.db_table
RESERVATION_HISTORY = ReservationHistory._meta.db_table
THROUGHPUT_QUEUE = "bench-throughput"

# The state of row g of n. "week": a week of an unarchived queue, by g % 100 (70% done, 10% dead, 15% ready, 3%
# reserved, 2% cancelled). "open": the hot table of the partitioned layout, finished items archived a minute
# after they finish: the newest 2% done (finished lately, not archived yet), the rest 90% ready, 5% reserved,
# 5% dead (dead items stay hot): 93% of the rows open.
MIXES = {
    "week": "CASE WHEN g %% 100 < 70 THEN 'done' WHEN g %% 100 < 80 THEN 'dead' WHEN g %% 100 < 95 THEN 'ready' "
    "WHEN g %% 100 < 98 THEN 'reserved' ELSE 'cancelled' END",
    "open": "CASE WHEN g > %(n)s - %(n)s / 50 THEN 'done' WHEN g %% 100 < 90 THEN 'ready' "
    "WHEN g %% 100 < 95 THEN 'reserved' ELSE 'dead' END",
}
# One row per g in the mix's states; queue and task vary
# independently of state; created_at climbs with the id over the last 7 days; 10% carry a dedup key and 10%
# an ordering key. Started items (done, dead, reserved) get one reservation whose id equals the item's id.
ITEMS_SQL = f"""
WITH g AS (
    SELECT g, {{STATE}} AS state,
           now() - make_interval(secs => %(idle)s + (%(n)s - g) * 604800.0 / %(n)s) AS created
    FROM generate_series(%(lo)s, %(hi)s) AS g
)
INSERT INTO {ITEMS} (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts, max_attempts,
                     lease_timeout, dedup_key, ordering_key, reservation_id, result, error, created_at, updated_at,
                     finished_at)
SELECT g, 'bench-' || (g / 100) %% {QUEUES}, 'bench.task_' || lpad(((g / 500) %% {TASKS})::text, 2, '0'),
       jsonb_build_object('order', g, 'customer', 'c-' || g %% 1000, 'note', repeat('x', 64)),
       state, (g %% 3) - 1, created,
       CASE WHEN state = 'reserved' THEN now() + interval '60 seconds' ELSE created END,
       CASE state WHEN 'ready' THEN 0 WHEN 'dead' THEN 5 WHEN 'cancelled' THEN 0 ELSE 1 END, 5, NULL,
       CASE WHEN g %% 10 = 0 THEN 'dedup-' || g END,
       CASE WHEN g %% 10 = 1 THEN 'acct-' || g %% 20000 END,
       CASE WHEN state IN ('done', 'dead', 'reserved') THEN g END,
       CASE WHEN state = 'done' THEN '{{"ok": true}}'::jsonb END,
       CASE WHEN state = 'dead' THEN 'ValueError: bench failure ' || g ELSE '' END,
       created, created,
       CASE WHEN state IN ('done', 'dead', 'cancelled') THEN created + interval '1 second' END
FROM g
"""
RESERVATIONS_SQL = f"""
INSERT INTO {RESERVATIONS} (id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at,
                            finished_at, outcome, error, traceback)
SELECT id, id, greatest(attempts, 1), 'bench-worker-' || id %% 8, created_at, created_at + interval '60 seconds',
       created_at, finished_at, CASE state WHEN 'done' THEN 'done' WHEN 'dead' THEN 'dead' END, error,
       CASE WHEN state = 'dead'
            THEN E'Traceback (most recent call last):\\n  File "bench.py", line 1, in handler\\n' || error
            ELSE '' END
FROM {ITEMS} WHERE id BETWEEN %(lo)s AND %(hi)s AND state IN ('done', 'dead', 'reserved')
"""
DEAD_LETTERS_SQL = f"""
INSERT INTO {DEAD_LETTERS} (item_id, reason, last_error, died_at, requeued_by)
SELECT id, 'max attempts exhausted', error, finished_at, ''
FROM {ITEMS} WHERE id BETWEEN %(lo)s AND %(hi)s AND state = 'dead'
"""
# History rows lo..hi of n (ids after the hot items'), finished over the last %(days)s days, oldest first; 5%
# cancelled; one reservation each, its id the item's. Every day's partition is created first (PARTITIONS_SQL).
PARTITIONS_SQL = """
SELECT count(*) FROM generate_series(0, %(days)s) AS d
WHERE queue_app_history_partition((now() AT TIME ZONE 'UTC')::date - d)
"""
HISTORY_SQL = f"""
WITH g AS (
    SELECT g, CASE WHEN g %% 100 < 95 THEN 'done' ELSE 'cancelled' END AS state,
           now() - make_interval(secs => (%(last)s - g) * (%(days)s * 86400.0 - 60) / %(n)s + 60) AS finished
    FROM generate_series(%(lo)s, %(hi)s) AS g
)
INSERT INTO {ITEM_HISTORY} (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
                            max_attempts, dedup_key, ordering_key, reservation_id, result, error, created_at,
                            updated_at, finished_at)
SELECT g, 'bench-' || (g / 100) %% {QUEUES}, 'bench.task_' || lpad(((g / 500) %% {TASKS})::text, 2, '0'),
       jsonb_build_object('order', g, 'customer', 'c-' || g %% 1000, 'note', repeat('x', 64)),
       state, (g %% 3) - 1, finished - interval '2 seconds', finished, 1, 5,
       CASE WHEN g %% 10 = 0 THEN 'dedup-' || g END, CASE WHEN g %% 10 = 1 THEN 'acct-' || g %% 20000 END,
       g, CASE WHEN state = 'done' THEN '{{"ok": true}}'::jsonb END, '',
       finished - interval '2 seconds', finished, finished
FROM g
"""
RESERVATION_HISTORY_SQL = f"""
INSERT INTO {RESERVATION_HISTORY} (id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at,
                                   finished_at, outcome, not_done_at, error, traceback, item_finished_at)
SELECT id, id, 1, 'bench-worker-' || id %% 8, finished_at - interval '1 second', finished_at + interval '60 seconds',
       finished_at, finished_at, CASE state WHEN 'done' THEN 'done' ELSE 'cancelled' END,
       CASE WHEN state = 'cancelled' THEN finished_at END, '', '', finished_at
FROM {ITEM_HISTORY} WHERE id BETWEEN %(lo)s AND %(hi)s
"""
# The id marks the worker's id_marks unit (engine/marks.py) would have taken every ID_MARK_EVERY seconds over the
# loaded week and the idle time after it: row g was created at or before now() - idle - (n - g) * 604800 / n
# (now() here is after every load batch's), so every row created at or after t has
# g >= n - (now() - idle - t) * n / 604800; reservations share the ids and the stamps. Without them the time
# filters of a week-old site would be timed as on a new install.
MARKS_SQL = f"""
INSERT INTO {IdMark._meta.db_table} (taken_at, item_id, reservation_id)
SELECT t, m, m FROM (
    SELECT t, least(greatest(ceil(%(n)s - (extract(epoch FROM now() - t) - %(idle)s) * %(n)s / 604800.0)::bigint - 1,
                             0), %(n)s) AS m
    FROM generate_series(now() - interval '7 days' - make_interval(secs => %(idle)s), now(),
                         make_interval(secs => %(every)s)) AS t
) AS marks
"""
SEQUENCES_SQL = f"""
SELECT setval(pg_get_serial_sequence('{ITEMS}', 'id'),
              greatest((SELECT max(id) FROM {ITEMS}), (SELECT max(id) FROM {ITEM_HISTORY}), 1)),
       setval(pg_get_serial_sequence('{RESERVATIONS}', 'id'),
              greatest((SELECT max(id) FROM {RESERVATIONS}), (SELECT max(id) FROM {RESERVATION_HISTORY}), 1))
"""


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (p95 of 20 samples is the 19th fastest)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


class AdminBench:
    """The benchmark `manage.py admin_bench` runs: load, then time; writes its report to `stdout`."""

    def __init__(self, stdout, style) -> None:
        self.stdout = stdout
        self.style = style

    def run(
        self,
        *,
        items,
        quick,
        mix,
        requests,
        budget_ms,
        reset,
        reuse,
        history,
        history_days,
        throughput,
        idle_minutes,
        datasets=None,
        materializations=None,
        only="all",
        **o,
    ) -> None:
        self.only = only
        n = 50_000 if quick else items
        self.datasets = (1_000 if quick else 0) if datasets is None else datasets
        if self.datasets < 0 or (materializations is not None and materializations < 0):
            raise CommandError("--datasets and --materializations must be >= 0")
        if min(n, history, throughput) < 0 or history_days < 1:
            raise CommandError("--items, --history and --throughput must be >= 0, --history-days >= 1")
        if not reuse:
            self.load(n, mix, reset=reset, idle=idle_minutes * 60.0)
        if self.datasets:
            took = admin_datasets.declare(self.datasets)
            self.stdout.write(f"declared {self.datasets:,} datasets and their jobs in {took:.1f} s")
            if not reuse:
                m = 100 * self.datasets if materializations is None else materializations
                admin_datasets.load(self.datasets, m, self.stdout)
        before = self.throughput(throughput) if throughput else None
        if history and not reuse:
            self.load_history(history, history_days)
        if before is not None:
            after = self.throughput(throughput)
            self.stdout.write(
                f"lease+settle: {before:,.0f} items/s with an empty history, {after:,.0f} items/s with "
                f"{ItemHistory.objects.order_by('-id').values_list('id', flat=True).first() or 0:,} as the newest "
                f"archived id: ratio {after / before:.2f} (goal >= 0.90)"
            )
        self.time_views(requests, budget_ms)

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, n: int, mix: str, *, reset: bool, idle: float = 0.0) -> None:
        if QueueItem.objects.exists():
            if not reset:
                raise CommandError("the queue has items: pass --reset to delete every queue row, or --reuse")
            with connection.cursor() as cur:
                cur.execute(
                    f"TRUNCATE {ITEMS}, {RESERVATIONS}, {DEAD_LETTERS}, {ITEM_HISTORY}, {RESERVATION_HISTORY}, "
                    f"{IdMark._meta.db_table} CASCADE"
                )
            Worker.objects.filter(id__startswith="bench-").delete()
        started = time.perf_counter()
        Queue.objects.bulk_create([Queue(name=f"bench-{i}") for i in range(QUEUES)], ignore_conflicts=True)
        for lo in range(1, n + 1, BATCH):
            hi = min(n, lo + BATCH - 1)
            with transaction.atomic(), connection.cursor() as cur:
                params = {"n": n, "lo": lo, "hi": hi, "idle": idle}
                cur.execute(ITEMS_SQL.replace("{STATE}", MIXES[mix]), params)
                cur.execute(RESERVATIONS_SQL, params)
                cur.execute(DEAD_LETTERS_SQL, params)
            self.stdout.write(f"  loaded items {lo:,}..{hi:,} ({time.perf_counter() - started:.0f} s)")
        with connection.cursor() as cur:
            cur.execute(SEQUENCES_SQL)
            cur.execute(MARKS_SQL, {"n": n, "idle": idle, "every": queue_settings.ID_MARK_EVERY})
            cur.execute(
                f"INSERT INTO {Worker._meta.db_table} (id, host, pid, queues, concurrency, started_at, "
                "last_heartbeat, state, stats) SELECT 'bench-worker-' || i, 'bench-host', 1000 + i, '[]', 8, now(), "
                "now(), 'running', '{}' FROM generate_series(0, 7) i ON CONFLICT (id) DO NOTHING"
            )
            for table in (ITEMS, RESERVATIONS, DEAD_LETTERS):
                cur.execute(f"VACUUM ANALYZE {table}")
        self.stdout.write(f"loaded {n:,} items in {time.perf_counter() - started:.0f} s (VACUUM ANALYZE done)")

    def load_history(self, h: int, days: int) -> None:
        started = time.perf_counter()
        newest = [m.objects.order_by("-id").values_list("id", flat=True).first() or 0 for m in (QueueItem, ItemHistory)]
        first = max(newest) + 1  # after every id in use: a second load adds to the history
        with connection.cursor() as cur:
            cur.execute(PARTITIONS_SQL, {"days": days})
        last = first + h - 1
        for lo in range(first, last + 1, BATCH):
            hi = min(last, lo + BATCH - 1)
            with transaction.atomic(), connection.cursor() as cur:
                params = {"n": h, "lo": lo, "hi": hi, "last": last, "days": days}
                cur.execute(HISTORY_SQL, params)
                cur.execute(RESERVATION_HISTORY_SQL, params)
            self.stdout.write(
                f"  loaded history {lo - first + 1:,}..{hi - first + 1:,} ({time.perf_counter() - started:.0f} s)"
            )
        with connection.cursor() as cur:
            cur.execute(SEQUENCES_SQL)
            for table in (ITEM_HISTORY, RESERVATION_HISTORY):
                cur.execute(f"VACUUM ANALYZE {table}")
        self.stdout.write(f"loaded {h:,} archived items in {time.perf_counter() - started:.0f} s (VACUUM ANALYZE done)")

    def throughput(self, k: int, rounds: int = 3) -> float:
        """The best of `rounds` runs (each after a CHECKPOINT, so a load's dirty pages are not what is measured)
        of lease + settle of k no-op items, items per second."""
        rates = []
        for _ in range(rounds):
            with connection.cursor() as cur:
                cur.execute("CHECKPOINT")
            rates.append(self.lease_and_settle(k))
        self.stdout.write(f"  lease+settle rounds: {', '.join(f'{r:,.0f}' for r in rates)} items/s")
        return max(rates)

    def lease_and_settle(self, k: int) -> float:
        """Items per second through lease + settle (settle_and_lease, batches of 1,000) of k no-op items."""
        engine.enqueue_many("queue_app.noop", [{}] * k, queue=THROUGHPUT_QUEUE)
        with connection.cursor() as cur:
            cur.execute(f"VACUUM ANALYZE {ITEMS}")
        started, done = time.perf_counter(), []
        while True:
            out = engine.settle_and_lease([(h, None) for h in done], [THROUGHPUT_QUEUE], 1000, "bench-tp", 600)
            if not (done := out.leases):
                break
        rate = k / (time.perf_counter() - started)
        QueueItem.objects.filter(queue_id=THROUGHPUT_QUEUE).delete()  # the same hot table for the next run
        with connection.cursor() as cur:
            cur.execute(f"VACUUM ANALYZE {ITEMS}")
            cur.execute(f"VACUUM ANALYZE {RESERVATIONS}")
        return rate

    # -- timing ---------------------------------------------------------------------------------------------------

    def cases(self) -> list[tuple[str, str, bool]]:
        """(label, url, gated by the budget)."""
        if getattr(self, "only", "all") == "datasets":
            return admin_datasets.cases(self.datasets)
        total = QueueItem.objects.order_by("-id").values_list("id", flat=True).first() or 1
        middle = total // 2
        dedup = QueueItem.objects.filter(dedup_key__isnull=False, id__lte=middle).order_by("-id").first()
        ordering = QueueItem.objects.filter(ordering_key__isnull=False, id__lte=middle).order_by("-id").first()
        letter = DeadLetter.objects.filter(item_id__lte=middle).order_by("-id").values_list("id", flat=True).first()
        queue, task = "bench-3", "bench.task_07"
        items, dead = "/admin/queue_app/queueitem/", "/admin/queue_app/deadletter/"
        res = "/admin/queue_app/reservation/"
        return [
            ("items: no filter", items, True),
            ("items: page 2", f"{items}?p=2", True),
            ("items: queue", f"{items}?queue__name__exact={queue}", True),
            ("items: state=dead", f"{items}?state__exact=dead", True),
            ("items: state=ready, page 2", f"{items}?state__exact=ready&p=2", True),
            ("items: task", f"{items}?task={task}", True),
            ("items: created last hour", f"{items}?created=1h", True),
            ("items: created 24h + state=dead", f"{items}?created=24h&state__exact=dead", True),
            ("items: queue + state + task", f"{items}?queue__name__exact={queue}&state__exact=done&task={task}", True),
            ("items: search id", f"{items}?q={middle}", True),
            ("items: search dedup key", f"{items}?q={dedup.dedup_key if dedup else 'none'}", True),
            ("items: search ordering key", f"{items}?q={ordering.ordering_key if ordering else 'none'}", True),
            ("dead letters: no filter", dead, True),
            ("dead letters: page 2", f"{dead}?p=2", True),
            ("dead letters: queue", f"{dead}?item__queue__name__exact={queue}", True),
            ("dead letters: task", f"{dead}?task={task}", True),
            ("dead letters: died last 24h", f"{dead}?died=24h", True),
            (
                "dead letters: open, queue + task",
                f"{dead}?status=open&item__queue__name__exact={queue}&task={task}",
                True,
            ),
            ("dead letters: search id", f"{dead}?q={letter}", True),
            ("reservations: no filter", res, True),
            ("reservations: page 2", f"{res}?p=2", True),
            ("reservations: outcome=dead", f"{res}?outcome__exact=dead", True),
            ("reservations: queue", f"{res}?item__queue__name__exact={queue}", True),
            ("reservations: reserved last hour", f"{res}?reserved=1h", True),
            ("reservations: search item id", f"{res}?q={middle}", True),
            ("reservations: search worker id", f"{res}?q=bench-worker-3", True),
            ("dead letters: search dedup key", f"{dead}?q={dedup.dedup_key if dedup else 'none'}", True),
            *self.history_cases(),
            *(admin_datasets.cases(self.datasets) if getattr(self, "datasets", 0) else []),
            ("item detail page", f"{items}{middle}/change/", False),
            ("overview (admin index)", "/admin/", False),
            ("overview fragment (refresh)", "/admin/queue_app/queue/overview/", False),
            ("/metrics", "/metrics", False),
        ]

    def history_cases(self) -> list[tuple[str, str, bool]]:
        newest = ItemHistory.objects.order_by("-id").values_list("id", flat=True).first()
        if newest is None:
            return []
        oldest = ItemHistory.objects.order_by("id").values_list("id", flat=True).first()
        middle = (oldest + newest) // 2
        dedup = ItemHistory.objects.filter(id__gte=middle - 20, dedup_key__isnull=False).order_by("id").first()
        queue, task = "bench-3", "bench.task_07"
        items, res = "/admin/queue_app/itemhistory/", "/admin/queue_app/reservationhistory/"
        return [
            ("history: no filter", items, True),
            ("history: page 2", f"{items}?p=2", True),
            ("history: queue", f"{items}?queue={queue}", True),
            ("history: state=cancelled", f"{items}?state__exact=cancelled", True),
            ("history: task", f"{items}?task={task}", True),
            ("history: finished last hour", f"{items}?finished=1h", True),
            ("history: queue + state + task", f"{items}?queue={queue}&state__exact=done&task={task}", True),
            ("history: search id", f"{items}?q={middle}", True),
            ("history: search dedup key", f"{items}?q={dedup.dedup_key if dedup else 'none'}", True),
            ("reservation history: no filter", res, True),
            ("reservation history: search item id", f"{res}?q={middle}", True),
            ("archived item detail page", f"{items}{middle}/change/", False),
        ]

    def time_views(self, requests: int, budget_ms: float) -> None:
        serving.settle()  # as a server process does once loaded (jobsite/wsgi.py): this one serves the pages
        user, _ = get_user_model().objects.get_or_create(
            username="admin-bench", defaults={"is_staff": True, "is_superuser": True}
        )
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
        loaded = QueueItem.objects.order_by("-id").values_list("id", flat=True).first() or 0
        self.stdout.write(
            f"\ntiming {requests} requests per view, about {loaded:,} items loaded, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n"
            "(cpu: this process's CPU time per request, the part other load on the machine does not inflate)\n"
        )
        header = f"{'view':<40} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'cpu ms':>8}  result"
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        failed = []
        for label, url, gated in self.cases():
            for _ in range(2):  # warm: connection, template and plan caches
                response = client.get(url)
                if response.status_code != 200:
                    raise CommandError(f"{label}: GET {url} answered {response.status_code}")
            samples, cpu = [], []
            for _ in range(requests):
                t0, c0 = time.perf_counter(), time.process_time()
                client.get(url)
                samples.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
            p50, p95 = statistics.median(samples), percentile(samples, 95)
            verdict = ("PASS" if p95 < budget_ms else "FAIL") if gated else "(info)"
            if gated and p95 >= budget_ms:
                failed.append(label)
            self.stdout.write(
                f"{label:<40} {p50:8.1f} {p95:8.1f} {max(samples):8.1f} {statistics.median(cpu):8.1f}  {verdict}"
            )
        self.stdout.write(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
        if failed:
            raise CommandError(f"p95 over {budget_ms:.0f} ms: {', '.join(failed)}")
        self.stdout.write(self.style.SUCCESS(f"every change list under {budget_ms:.0f} ms at p95"))
