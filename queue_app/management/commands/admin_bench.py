"""``manage.py admin_bench``: load a million queue items and time the admin's change lists on them.

Loads N items (default 1,000,000; ``--quick``: 50,000) spread over queues, tasks, states and a week of creation
times, with an attempt per started item and a dead letter per dead one (server-side INSERT ... SELECT
generate_series in batches, then VACUUM ANALYZE), then requests the item and dead-letter change lists (plain,
filtered by queue / state / task / time, searched by id and keys, page 2) as a logged-in superuser through
Django's test client and prints p50 / p95 per view against the budget (300 ms). Exits 1 when a list misses it.

Loading needs an empty queue (or ``--reset``, which deletes every queue row in the database: use a database of
its own). ``--reuse`` times what is already loaded.
"""

import math
import os
import statistics
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.test import Client

from queue_app.models import DeadLetter, Queue, QueueItem, Reservation, Worker

QUEUES = 5
TASKS = 20
BATCH = 100_000
ITEMS = QueueItem._meta.db_table
RESERVATIONS = Reservation._meta.db_table
DEAD_LETTERS = DeadLetter._meta.db_table

# One row per g: 70% done, 10% dead, 15% ready, 3% reserved, 2% cancelled (by g % 100); queue and task vary
# independently of state; created_at climbs with the id over the last 7 days; 10% carry a dedup key and 10%
# an ordering key. Started items (done, dead, reserved) get one reservation whose id equals the item's id.
ITEMS_SQL = f"""
WITH g AS (
    SELECT g, CASE WHEN g %% 100 < 70 THEN 'done' WHEN g %% 100 < 80 THEN 'dead' WHEN g %% 100 < 95 THEN 'ready'
                   WHEN g %% 100 < 98 THEN 'reserved' ELSE 'cancelled' END AS state,
           now() - make_interval(secs => (%(n)s - g) * 604800.0 / %(n)s) AS created
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
SEQUENCES_SQL = f"""
SELECT setval(pg_get_serial_sequence('{ITEMS}', 'id'), (SELECT max(id) FROM {ITEMS})),
       setval(pg_get_serial_sequence('{RESERVATIONS}', 'id'), (SELECT max(id) FROM {RESERVATIONS}))
"""


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (p95 of 20 samples is the 19th fastest)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


class Command(BaseCommand):
    help = "Load N queue items (default 1,000,000) and time the admin change lists on them (goal: p95 < 300 ms)."

    def add_arguments(self, parser):
        parser.add_argument("--items", type=int, default=1_000_000, help="items to load (default 1,000,000)")
        parser.add_argument("--quick", action="store_true", help="load 50,000 items instead")
        parser.add_argument("--requests", type=int, default=20, help="timed requests per view (default 20)")
        parser.add_argument("--budget-ms", type=float, default=300.0, help="p95 goal per view (default 300)")
        parser.add_argument("--reset", action="store_true", help="delete every queue row first (own database!)")
        parser.add_argument("--reuse", action="store_true", help="time the rows already loaded; load nothing")

    def handle(self, *args, items, quick, requests, budget_ms, reset, reuse, **options):
        n = 50_000 if quick else items
        if not reuse:
            self.load(n, reset=reset)
        self.time_views(requests, budget_ms)

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, n: int, *, reset: bool) -> None:
        if QueueItem.objects.exists():
            if not reset:
                raise CommandError("the queue has items: pass --reset to delete every queue row, or --reuse")
            with connection.cursor() as cur:
                cur.execute(f"TRUNCATE {ITEMS}, {RESERVATIONS}, {DEAD_LETTERS} CASCADE")
            Worker.objects.filter(id__startswith="bench-").delete()
        started = time.perf_counter()
        Queue.objects.bulk_create([Queue(name=f"bench-{i}") for i in range(QUEUES)], ignore_conflicts=True)
        for lo in range(1, n + 1, BATCH):
            hi = min(n, lo + BATCH - 1)
            with transaction.atomic(), connection.cursor() as cur:
                params = {"n": n, "lo": lo, "hi": hi}
                cur.execute(ITEMS_SQL, params)
                cur.execute(RESERVATIONS_SQL, params)
                cur.execute(DEAD_LETTERS_SQL, params)
            self.stdout.write(f"  loaded items {lo:,}..{hi:,} ({time.perf_counter() - started:.0f} s)")
        with connection.cursor() as cur:
            cur.execute(SEQUENCES_SQL)
            cur.execute(
                f"INSERT INTO {Worker._meta.db_table} (id, host, pid, queues, concurrency, started_at, "
                "last_heartbeat, state, stats) SELECT 'bench-worker-' || i, 'bench-host', 1000 + i, '[]', 8, now(), "
                "now(), 'running', '{}' FROM generate_series(0, 7) i ON CONFLICT (id) DO NOTHING"
            )
            for table in (ITEMS, RESERVATIONS, DEAD_LETTERS):
                cur.execute(f"VACUUM ANALYZE {table}")
        self.stdout.write(f"loaded {n:,} items in {time.perf_counter() - started:.0f} s (VACUUM ANALYZE done)")

    # -- timing ---------------------------------------------------------------------------------------------------

    def cases(self) -> list[tuple[str, str, bool]]:
        """(label, url, gated by the budget)."""
        total = QueueItem.objects.order_by("-id").values_list("id", flat=True).first() or 1
        middle = total // 2
        dedup = QueueItem.objects.filter(dedup_key__isnull=False, id__lte=middle).order_by("-id").first()
        ordering = QueueItem.objects.filter(ordering_key__isnull=False, id__lte=middle).order_by("-id").first()
        letter = DeadLetter.objects.filter(item_id__lte=middle).order_by("-id").values_list("id", flat=True).first()
        queue, task = "bench-3", "bench.task_07"
        items, dead = "/admin/queue_app/queueitem/", "/admin/queue_app/deadletter/"
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
            ("dead letters: search dedup key", f"{dead}?q={dedup.dedup_key if dedup else 'none'}", True),
            ("item detail page", f"{items}{middle}/change/", False),
            ("overview (admin index)", "/admin/", False),
            ("overview fragment (refresh)", "/admin/queue_app/queue/overview/", False),
            ("/metrics", "/metrics", False),
        ]

    def time_views(self, requests: int, budget_ms: float) -> None:
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
