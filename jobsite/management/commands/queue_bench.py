"""`manage.py queue_bench`: the queue's benchmark against the PostgreSQL ceiling and the peers (see
jobsite/bench/). `--quick` for a CI smoke run, `--full` (default) for the README's figures, `--churn` for the
hour of steady churn that measures table and index growth.

    python manage.py queue_bench --quick --only ceiling
    python manage.py queue_bench --peers procrastinate,celery_redis
    python manage.py queue_bench --churn --churn-minutes 60

A part that fails is reported (name, error and the end of its traceback, in the table and the JSON's
`failures`), the other parts still run, and the command exits 1 at the end.
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jobsite.bench.peers import PEERS
from jobsite.bench.runner import PARTS, run_bench
from jobsite.bench.sizes import FULL, QUICK, SMOKE


def _names(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise CommandError(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return names


class Command(BaseCommand):
    help = "Measure the queue against the PostgreSQL ceiling (pgbench) and peer queues on this machine."

    def add_arguments(self, parser):
        size = parser.add_mutually_exclusive_group()
        size.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run")
        size.add_argument("--full", action="store_true", help="full sizes for the README (default)")
        size.add_argument(
            "--smoke", action="store_true", help="every part once at the smallest sizes (the test suite's; no figures)"
        )
        parser.add_argument("--only", default=None, help=f"comma-separated parts: {','.join(PARTS)} (default: all)")
        parser.add_argument("--peers", default=",".join(PEERS), help=f"peers to run (default: {','.join(PEERS)})")
        parser.add_argument(
            "--churn", action="store_true", help="measure table growth under steady churn (alone unless --only)"
        )
        parser.add_argument("--churn-minutes", type=float, default=60.0, help="length of the churn run")
        parser.add_argument(
            "--churn-rate", type=int, default=1_400, help="items queued per second while churning (default 1,400)"
        )
        parser.add_argument("--json-out", type=Path, default=None, help="results file (default var/bench/<ts>.json)")
        parser.add_argument("--db-prefix", default="bench", help="scratch databases are named <prefix>_<part>")
        parser.add_argument("--keep-dbs", action="store_true", help="keep the scratch databases afterwards")
        parser.add_argument(
            "--dsn",
            default=None,
            help="the pooler part through this pooler (postgres://host:port, transaction mode, in front of the same"
            " server) instead of a PgBouncer it starts",
        )

    def handle(self, *args, **options):
        sizes = SMOKE if options["smoke"] else QUICK if options["quick"] else FULL
        if options["only"] is not None:
            parts = _names(options["only"], PARTS, "part")
        else:
            parts = [] if options["churn"] else list(PARTS)
        if options["churn_minutes"] <= 0:
            raise CommandError("--churn-minutes must be positive")
        if options["churn_rate"] <= 0:
            raise CommandError("--churn-rate must be positive")

        def write(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        results, _ = run_bench(
            sizes=sizes,
            parts=parts,
            peer_names=_names(options["peers"], tuple(PEERS), "peer"),
            churn_minutes=options["churn_minutes"] if options["churn"] else None,
            churn_rate=options["churn_rate"],
            json_out=options["json_out"],
            db_prefix=options["db_prefix"],
            keep_databases=options["keep_dbs"],
            write=write,
            pooler_dsn=options["dsn"],
        )
        if results.failures:
            failed = ", ".join(f"{f['part']} ({f['error']})" for f in results.failures)
            raise CommandError(f"{len(results.failures)} part(s) failed: {failed}; the others ran (table above)")
