"""What a web server process does once its application is loaded (jobsite/wsgi.py, jobsite/asgi.py); admin_bench
does the same before it times the pages it serves in its own process."""

import contextlib
import gc

from django.db import DatabaseError


def settle() -> None:
    """Load what the pages read (the declared datasets and Spark jobs, the lineage built of them), then put every
    object loaded so far out of the cyclic collector's sight (gc.freeze, as a worker does when it starts:
    queue_app/worker/supervisor.py). With 10,000 datasets and their jobs declared that is ~275,000 objects, which
    every full collection walked: a pause of ~100 ms idle and 300-640 ms on a loaded 2-core machine, in about one
    request of 15 of a dataset page (its p95)."""
    from queue_app.datasets import declared_datasets
    from queue_app.datasets.spark_runs import lineage

    declared_datasets()
    with contextlib.suppress(DatabaseError):  # it reads the stored scripts: a database not up yet leaves it for later
        lineage()
    gc.collect()
    gc.freeze()
