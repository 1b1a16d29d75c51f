"""`manage.py spark_bench`: Spark start-up (bare spark-submit vs a script through jobsite) and queue analytics
(full rebuild and incremental vs PostgreSQL's own aggregate), from one run; see jobsite/bench/spark_bench.py.

    python manage.py spark_bench --quick
    python manage.py spark_bench --history 1000000 --new 100000 --json
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/mine_bench python manage.py spark_bench --skip-startup \\
        --history 10000000 --new 100000 --partitions 2 --keep      # the issue's sizes; --keep reuses the history
    python manage.py spark_bench --skip-analytics     # start-up only: cold spark-submit vs the warm Connect server
    python manage.py spark_bench --vs-submit 4        # only: a word count, bare spark-submit vs spark_run --script
                                                      # --wait, 4 pairs (jobsite/bench/spark_vs_submit.py)
"""

import json

from django.core.management.base import BaseCommand

from jobsite.bench import spark_bench, spark_vs_submit

QUICK = {"history": 100_000, "new": 10_000}
DEFAULT = {"history": 1_000_000, "new": 100_000}


class Command(BaseCommand):
    help = "Measure Spark start-up through jobsite and queue analytics (full, incremental) against PostgreSQL."

    def add_arguments(self, parser):
        parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
        parser.add_argument("--history", type=int, help="reservations of history (default 1,000,000; quick 100,000)")
        parser.add_argument("--new", type=int, help="reservations added before the incremental run")
        parser.add_argument("--partitions", type=int, default=4, help="parallel JDBC range reads")
        parser.add_argument(
            "--keep",
            action="store_true",
            help="keep the seeded history at the end and reuse it when the next --keep run asks for as many rows",
        )
        parser.add_argument("--skip-startup", action="store_true", help="only the analytics part")
        parser.add_argument("--skip-analytics", action="store_true", help="only start-up (cold and warm)")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print the figures as JSON")
        parser.add_argument(
            "--vs-submit",
            type=int,
            metavar="PAIRS",
            help="only this: a script by `spark_run --script --wait` vs bare spark-submit, PAIRS alternating pairs",
        )

    def handle(
        self, *args, quick, history, new, partitions, keep, skip_startup, skip_analytics, as_json, vs_submit, **options
    ):
        if vs_submit is not None:
            self.vs_submit(vs_submit, as_json)
            return
        sizes = QUICK if quick else DEFAULT
        history, new = history or sizes["history"], new or sizes["new"]
        for name, value in (("--history", history), ("--new", new), ("--partitions", partitions)):
            if value < 1:
                self.stderr.write(f"{name} must be at least 1")
                raise SystemExit(2)
        say = self.stderr.write if as_json else self.stdout.write
        figures = {}
        if not skip_analytics:
            figures["analytics"] = spark_bench.analytics(history, new, partitions, say, keep=keep)
        if not skip_startup:
            figures["startup"] = spark_bench.startup(say)
            figures["warm"] = spark_bench.warm(say)
        if as_json:
            self.stdout.write(json.dumps(figures))
            return
        if "analytics" in figures:
            a = figures["analytics"]
            self.stdout.write(
                f"reader: {a['reader']} ({a['partitions']} partitions); Spark fixed costs outside the figures: "
                f"JVM and session start {a['jvm_start_s']:.1f} s, first full run {a['first_full_s']:.1f} s"
            )
            for part in ("full", "incremental"):
                f = a[part]
                self.stdout.write(
                    f"{part:12} {f['attempts']:>10,} attempts  spark {f['spark_s']:.2f} s  "
                    f"postgres {f['postgres_s']:.2f} s  ratio {f['ratio']:.2f}x"
                )
        if "startup" in figures:
            s = figures["startup"]
            self.stdout.write(
                f"start-up: bare spark-submit {s['bare_spark_submit_s']} s; jobsite cold {s['jobsite_cold_s']} s "
                f"(trigger -> first task seen {s['jobsite_cold_first_task_s']} s)"
            )
            w = figures["warm"]
            self.stdout.write(
                f"registered function, cold spark-submit: trigger -> first task {w['cold']['first_task_s']} s, "
                f"total {w['cold']['total_s']} s ({w['cold']['outcome']})"
            )
            for i, run in enumerate(w["warm_runs"], 1):
                self.stdout.write(
                    f"  warm Spark Connect run {i}: trigger -> first task {run['first_task_s']} s, "
                    f"total {run['total_s']} s ({run['outcome']}, {run['path']}"
                    f"{', spare light child' if run.get('spare_child') else ''})"
                )
            self.stdout.write(f"  trigger -> first task, cold / best warm: {w['first_task_ratio']}x")

    def vs_submit(self, pairs: int, as_json: bool) -> None:
        if pairs < 1:
            self.stderr.write("--vs-submit must be at least 1")
            raise SystemExit(2)
        figures = spark_vs_submit.run(pairs, self.stderr.write if as_json else self.stdout.write)
        if as_json:
            self.stdout.write(json.dumps(figures))
            return
        self.stdout.write(
            f"median of {pairs} pairs (load {', '.join(str(load) for load in figures['load'])}): bare spark-submit "
            f"{figures['bare_median_s']} s, jobsite {figures['jobsite_median_s']} s, "
            f"difference {figures['diff_median_s']:+.2f} s"
        )
        split = figures["split_median_s"]
        self.stdout.write(
            "jobsite's split (median seconds after queued): "
            + ", ".join(f"{step} {at}" for step, at in split.items() if step not in ("cli_start", "cli_end"))
        )
        self.stdout.write(
            f"outside the run: the CLI's start (process -> queued) {split.get('cli_start')} s, "
            f"its end (recorded -> exit) {split.get('cli_end')} s"
        )
