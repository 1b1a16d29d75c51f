"""The Django settings every Django-based peer's own processes share (migrate, enqueue, its worker): the
scratch database named by JOBSITE_BENCH_PEER_DSN and nothing else. Each peer's settings module adds its app.

`JOBSITE_BENCH_CONN_MAX_AGE`: "none" keeps connections open for the life of the process (the best setting for
a worker), a number of seconds otherwise.
"""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("JOBSITE_BENCH_PEER_DSN", "dbname=bench_peer"))
_max_age = os.environ.get("JOBSITE_BENCH_CONN_MAX_AGE", "none")

SECRET_KEY = "jobsite-bench-peer-not-secret"
DEBUG = False
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "CONN_MAX_AGE": None if _max_age == "none" else int(_max_age),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
