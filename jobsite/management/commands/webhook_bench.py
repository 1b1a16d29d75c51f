"""`manage.py webhook_bench`: deliveries per second to a loopback receiver that answers 200 at once, and event ->
delivery latency p50/p99 on an idle queue, with real run_worker processes on a scratch database (see
jobsite/bench/webhooks.py).

    python manage.py webhook_bench --quick
"""

from dataclasses import replace
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jobsite.bench import webhooks
from jobsite.bench.context import BenchContext, Progress, server_from_django

ROOT = Path(__file__).resolve().parents[3]


class Command(BaseCommand):
    help = "Measure webhook delivery: deliveries/s to a loopback receiver, event -> delivery latency."

    def add_arguments(self, parser):
        parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
        parser.add_argument("--db-prefix", default="bench", help="the scratch database is <prefix>_webhooks")
        parser.add_argument("--events", type=int, default=None, help="events for the throughput figure")
        parser.add_argument("--samples", type=int, default=None, help="events for the latency figure")

    def handle(self, *args, quick: bool, db_prefix: str, events: int | None, samples: int | None, **options):
        sizes = webhooks.QUICK if quick else webhooks.FULL
        for name, value in (("--events", events), ("--samples", samples)):
            if value is not None and value < 1:
                raise CommandError(f"{name} must be at least 1")
        sizes = replace(sizes, events=events or sizes.events, latency_samples=samples or sizes.latency_samples)

        def write(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        ctx = BenchContext(
            server=server_from_django(), db_prefix=db_prefix, progress=Progress(write), log_dir=ROOT / "var" / "bench"
        )
        webhooks.run(ctx, sizes, write)
