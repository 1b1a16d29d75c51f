"""``manage.py admin_bench``: load a million queue items and time the admin's change lists on them (goal: p95 under
300 ms per list). The benchmark lives in jobsite/bench/admin_bench.py, beside the other benchmarks."""

from django.core.management.base import BaseCommand

from jobsite.bench.admin_bench import MIXES, AdminBench


class Command(BaseCommand):
    help = "Load N queue items (default 1,000,000) and time the admin change lists on them (goal: p95 < 300 ms)."

    def add_arguments(self, parser):
        parser.add_argument("--items", type=int, default=1_000_000, help="items to load (default 1,000,000)")
        parser.add_argument("--quick", action="store_true", help="load 50,000 items instead")
        parser.add_argument(
            "--mix",
            choices=sorted(MIXES),
            default="week",
            help="the items' states: week (70%% done, the default) or open (93%% ready or reserved: with --history)",
        )
        parser.add_argument("--requests", type=int, default=20, help="timed requests per view (default 20)")
        parser.add_argument("--budget-ms", type=float, default=300.0, help="p95 goal per view (default 300)")
        parser.add_argument("--reset", action="store_true", help="delete every queue row first (own database!)")
        parser.add_argument("--reuse", action="store_true", help="time the rows already loaded; load nothing")
        parser.add_argument("--history", type=int, default=0, help="finished items to load into the history")
        parser.add_argument("--history-days", type=int, default=6, help="days the history spans (default 6)")
        parser.add_argument(
            "--idle-minutes",
            type=float,
            default=0.0,
            help="the loaded week ends this many minutes ago (nothing created since: the time filters' worst case)",
        )
        parser.add_argument(
            "--throughput", type=int, default=0, help="lease+settle this many items before and after the history"
        )

        parser.add_argument(
            "--datasets",
            type=int,
            default=None,
            help="declare this many datasets and their jobs and time the dataset pages (default 0; --quick: 1,000; "
            "the issue's size: 10,000)",
        )
        parser.add_argument(
            "--materializations",
            type=int,
            default=None,
            help="materializations to load over the datasets (default 100 per dataset)",
        )

        parser.add_argument(
            "--only",
            choices=["all", "datasets"],
            default="all",
            help="time every view (default) or only the dataset pages (with --items 0: no queue rows loaded)",
        )

    def handle(self, *args, **options):
        AdminBench(self.stdout, self.style).run(**options)
