"""Spark configuration for one run: master, app name and job group, the JDBC jar, and where Spark lives.

The launcher turns `run_conf()` into spark-submit arguments; the child then just calls
`SparkSession.builder.getOrCreate()` and gets that configuration. Spark is the pip-installed pyspark: its
package directory is a complete SPARK_HOME (bin/spark-submit, jars/), so nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

JDBC_JAR = "/usr/share/java/postgresql.jar"  # Debian's libpostgresql-jdbc-java; JOBSITE_JDBC_JAR overrides it
JDBC_HINT = "Debian/Ubuntu: `apt-get install libpostgresql-jdbc-java`, or point JOBSITE_JDBC_JAR at the jar"
DEFAULT_MASTER = "local[*]"
DEFAULT_LOG_LEVEL = "WARN"  # Spark's INFO chatter would bury the pipeline's own log lines in the run's tail


def spark_home() -> str:
    """The installed pyspark package directory, which is a complete SPARK_HOME. Found without importing pyspark
    (a second of a worker's first run under load): ModuleNotFoundError when it is not installed."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'pyspark'", name="pyspark")
    return os.path.abspath(spec.submodule_search_locations[0])


def spark_master() -> str:
    return os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def job_group(run_id: int | str) -> str:
    """The job group (and app name) of a run: progress polling and cancel address it by this name."""
    return f"jobsite-run-{run_id}"


def jdbc_jar_path() -> str:
    return os.environ.get("JOBSITE_JDBC_JAR") or JDBC_JAR


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver jar, None when it is not installed."""
    path = jdbc_jar_path()
    return path if os.path.isfile(path) else None


def run_conf(run_id: int | str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark configuration of one run; `extra` (the job's and the run's own conf) wins over the defaults."""
    conf = {
        "spark.app.name": job_group(run_id),
        # Hour buckets and dates are UTC whatever the machine's zone is.
        "spark.sql.session.timeZone": "UTC",
        # The child reports progress itself; Spark's console bar would only add \r-lines to the log.
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": os.environ.get("JOBSITE_SPARK_UI", "false"),
        "spark.log.level": os.environ.get("JOBSITE_SPARK_LOG_LEVEL", DEFAULT_LOG_LEVEL),
    }
    jar = jdbc_jar()
    if jar:
        conf["spark.jars"] = jar
    conf.update({k: str(v) for k, v in (extra or {}).items()})
    return conf
