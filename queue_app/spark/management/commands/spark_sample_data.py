"""``manage.py spark_sample_data``: sample input files for the file_rollup Spark job (demos, benchmarks)."""

import datetime as dt
import time

from django.core.management.base import BaseCommand, CommandError

from queue_app.spark.pipelines.file_rollup import FORMATS, SAMPLE_COLUMNS, write_sample_input


class Command(BaseCommand):
    help = f"Write sample event files ({', '.join(SAMPLE_COLUMNS)}) for the file_rollup Spark job."

    def add_arguments(self, parser):
        parser.add_argument("--output", required=True, help="Directory to write the files into (created).")
        parser.add_argument("--rows", type=int, default=100_000, help="Total rows (default 100000).")
        parser.add_argument("--days", type=int, default=7, help="Days the rows are spread over (default 7).")
        parser.add_argument("--format", choices=FORMATS, default="csv", help="csv with a header, or JSON lines.")
        parser.add_argument(
            "--start", type=dt.date.fromisoformat, default=dt.date(2025, 1, 1), help="First day, YYYY-MM-DD."
        )
        parser.add_argument("--files-per-day", type=int, default=1, help="Files per day (default 1).")
        parser.add_argument("--seed", type=int, default=42, help="Random seed; same seed, same files.")

    def handle(self, *args, output, rows, days, format, start, files_per_day, seed, **options):
        began = time.monotonic()
        try:
            paths = write_sample_input(
                output, rows=rows, days=days, fmt=format, start=start, files_per_day=files_per_day, seed=seed
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"wrote {rows} rows over {days} day(s) from {start} into {len(paths)} {format} file(s) in {output} "
            f"({time.monotonic() - began:.1f}s)"
        )
