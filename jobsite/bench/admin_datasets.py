"""admin_bench's datasets (issue 38): N declared datasets (issue size 10,000) with M materializations (1,000,000),
and the Spark jobs between them, so the Datasets list, a dataset's page and the lineage page of a 1,000-node
neighbourhood can be timed.

The datasets `bench_ds_00000`... are daily, declared in this process (code declarations: the admin's process is
this one), a third of them with a 26 h freshness policy. Job j (1..N-1) consumes dataset (j-1)//2 and produces
dataset j: a binary tree, so dataset 0's lineage to depth 8 holds 511 datasets and 510 jobs (1,021 nodes).
Materializations: M/N per dataset, one a day up to yesterday, loaded by INSERT ... SELECT generate_series in
batches, then VACUUM ANALYZE; rows of earlier bench datasets are deleted first.

Besides them, `bench_ds_matrix`: two dimensions, day by region (MATRIX_DAYS x MATRIX_REGIONS, 365 x 50), every
partition materialized once (18,250 rows), so the page's time-by-region matrix can be timed.
"""

from __future__ import annotations

import datetime as dt
import time

from django.contrib.admin.utils import quote
from django.db import connection, transaction

from queue_app.datasets import Freshness, MultiPartitions, StaticPartitions, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.models import Dataset, Materialization
from queue_app.datasets.sync import sync_datasets
from queue_app.params import Param
from queue_app.spark import spark_job
from queue_app.spark.registry import _jobs

PREFIX = "bench_ds_"
LINEAGE_DEPTH = 8  # dataset 0's neighbourhood to this depth: 2**9 - 1 datasets and as many jobs less one
BATCH = 200_000
MATERIALIZATIONS = Materialization._meta.db_table
MATRIX, MATRIX_DAYS, MATRIX_REGIONS = f"{PREFIX}matrix", 365, 50
REGIONS = [f"r{i:02d}" for i in range(MATRIX_REGIONS)]

MATRIX_SQL = f"""
INSERT INTO {MATERIALIZATIONS} (dataset, partition, at, rows, bytes, files, schema_fingerprint, metadata, source,
    spark_run_id)
SELECT %(name)s, to_char(current_date - d, 'YYYY-MM-DD') || '|' || r,
       now() - d * interval '1 day', 1000, 48000, 4, '', '{{}}', 'spark_run', d
FROM generate_series(1, %(days)s) d, unnest(%(regions)s::text[]) r
"""

LOAD_SQL = f"""
INSERT INTO {MATERIALIZATIONS} (dataset, partition, at, rows, bytes, files, schema_fingerprint, metadata, source,
    spark_run_id)
SELECT %(prefix)s || lpad((g %% %(n)s)::text, 5, '0'),
       to_char(current_date - (%(per)s - g / %(n)s), 'YYYY-MM-DD'),
       now() - (%(per)s - g / %(n)s) * interval '1 day' + (g %% 3600) * interval '1 second',
       1000 + g %% 500, (1000 + g %% 500) * 48, 4, '', '{{}}', 'spark_run', g
FROM generate_series(%(lo)s, %(hi)s) g
"""


def name(i: int) -> str:
    return f"{PREFIX}{i:05d}"


def declare(n: int) -> float:
    """Declare the N datasets and N-1 jobs in this process (again after a --reuse: declarations live in memory);
    returns the seconds it took."""
    started = time.perf_counter()
    for i in range(n):
        if _code.get(name(i)) is None:
            dataset(
                name(i),
                location=f"table:bench.{name(i)}",
                partitioning="daily",
                freshness=Freshness(max_age=dt.timedelta(hours=26)) if i % 3 == 0 else None,
            )
    if _code.get(MATRIX) is None:
        dataset(
            MATRIX,
            location=f"table:bench.{MATRIX}",
            partitioning=MultiPartitions(day="daily", region=StaticPartitions(REGIONS)),
        )
    day = [Param("day", "date")]
    for j in range(1, n):
        job = f"bench_job_{j:05d}"
        if _jobs.get(job) is None:
            spark_job(job, params=day, consumes=[name((j - 1) // 2)], produces={name(j): "day"})(_noop)
    return time.perf_counter() - started


def _noop(spark, params):  # the bench's jobs never run
    return {}


def load(n: int, m: int, stdout) -> None:
    """Rows: the datasets' (sync) and M materializations spread evenly over them."""
    started = time.perf_counter()
    per = max(1, m // n)
    with connection.cursor() as cur:
        cur.execute(f"DELETE FROM {MATERIALIZATIONS} WHERE dataset LIKE %s", [PREFIX + "%"])
        cur.execute(f"DELETE FROM {Dataset._meta.db_table} WHERE name LIKE %s", [PREFIX + "%"])
    sync_datasets()
    total = per * n
    for lo in range(0, total, BATCH):
        hi = min(total, lo + BATCH) - 1
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(LOAD_SQL, {"prefix": PREFIX, "n": n, "per": per, "lo": lo, "hi": hi})
        stdout.write(f"  loaded materializations {lo:,}..{hi:,} ({time.perf_counter() - started:.0f} s)")
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(MATRIX_SQL, {"name": MATRIX, "days": MATRIX_DAYS, "regions": REGIONS})
    with connection.cursor() as cur:
        cur.execute(f"VACUUM ANALYZE {MATERIALIZATIONS}")
        cur.execute(f"VACUUM ANALYZE {Dataset._meta.db_table}")
    stdout.write(f"loaded {n:,} datasets and {total:,} materializations in {time.perf_counter() - started:.0f} s")


def cases(n: int) -> list[tuple[str, str, bool]]:
    """(label, url, gated by the budget) of the dataset pages."""
    base = "/admin/jobsite_datasets/dataset/"
    middle = name(n // 2)
    nodes = min(n, 2 ** (LINEAGE_DEPTH + 1) - 1) * 2 - 1
    return [
        ("datasets: list", base, True),
        ("datasets: list page 2", f"{base}?p=2", True),
        ("datasets: search", f"{base}?q={middle}", True),
        ("dataset page", f"{base}{quote(middle)}/change/", True),
        (f"dataset page, {MATRIX_DAYS} x {MATRIX_REGIONS} matrix", f"{base}{quote(MATRIX)}/change/", True),
        (f"dataset lineage ({nodes:,} nodes)", f"{base}{name(0)}/lineage/?depth={LINEAGE_DEPTH}", True),
    ]
