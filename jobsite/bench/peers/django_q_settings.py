"""Settings for the django-q2 peer's processes: its app, its Django ORM broker on the scratch database, and the
cluster options of the variant being tried (JOBSITE_BENCH_Q_CLUSTER, JSON, over the defaults below).

The defaults are django-q2's documented throughput settings for tiny tasks: no success rows stored
(`save_limit: -1`, its way of not keeping finished jobs), workers not recycled every 500 tasks, no scheduler
polling the database, no retries (a no-op does not fail), and no log line per task (its INFO default writes two).
"""

import json
import os

from .peer_settings import *  # noqa: F403

INSTALLED_APPS = ["django_q"]
Q_CLUSTER = {
    "name": "jobsite_bench",
    "orm": "default",
    "save_limit": -1,
    "recycle": 1_000_000,
    "timeout": 60,
    "retry": 120,
    "max_attempts": 1,
    "scheduler": False,
    "catch_up": False,
    "log_level": "WARNING",
    **json.loads(os.environ.get("JOBSITE_BENCH_Q_CLUSTER", "{}")),
}
