"""Reading this project's PostgreSQL into Spark: JDBC over TCP, psycopg chunks over a unix socket.

The connection comes from Django's DATABASES['default'] (through the backend's own `get_connection_params()`,
so the embedded backend reports the socket directory of the cluster it started). The PostgreSQL JDBC driver
speaks TCP only (a unix socket needs junixsocket jars we do not ship), so:

* TCP host  -> `spark.read.jdbc` with the Debian driver jar (`spark.jars`), split into `num_partitions` range
  reads on a numeric column; executors read in parallel, and a cluster works as well as local mode.
* TCP host without the driver jar -> the psycopg reader below, with a warning in the run's log that says so
  (reader=jdbc without the jar is refused when the run is triggered and again before its JVM starts).
* socket    -> the driver process reads with a psycopg server-side cursor and hands Spark the rows chunk by
  chunk (`createDataFrame` per chunk, then a union): one reader, bounded memory in Python, fine for the
  embedded development database; executors need no database access.

Both paths take the same SQL and return the same schema, so a pipeline does not care which one ran.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

Reader = Literal["auto", "jdbc", "psycopg"]
READERS: tuple[str, ...] = ("auto", "jdbc", "psycopg")
_LIBPQ_KEYS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "options", "application_name")
_JDBC_KEYS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "options", "application_name")
PSYCOPG_CHUNK_ROWS = 50_000
log = logging.getLogger("jobsite.spark.db")


@dataclass(frozen=True)
class PostgresSource:
    host: str  # a hostname/IP, or a directory (unix socket), or "" (libpq's default socket)
    port: int
    dbname: str
    user: str = ""
    password: str = field(default="", repr=False)
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_socket(self) -> bool:
        return not self.host or self.host.startswith("/")

    @property
    def jdbc_url(self) -> str:
        if self.is_socket:
            raise ValueError(f"JDBC cannot reach PostgreSQL over the unix socket in {self.host or 'the default'}")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"jdbc:postgresql://{host}:{self.port}/{quote(self.dbname, safe='')}"

    def jdbc_properties(self) -> dict[str, str]:
        props = {"driver": "org.postgresql.Driver", "user": self.user}
        if self.password:
            props["password"] = self.password
        props.update({k: v for k, v in self.options.items() if k in _JDBC_KEYS})
        return props

    def psycopg_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dbname": self.dbname, "port": self.port, **self.options}
        if self.host:
            kwargs["host"] = self.host
        if self.user:
            kwargs["user"] = self.user
        if self.password:
            kwargs["password"] = self.password
        return kwargs


def postgres_source(alias: str | None = None) -> PostgresSource:
    """Where Django's database `alias` is (the queue's, JOBSITE["DATABASE"], by default), as its backend would
    connect (starts the embedded one if needed)."""
    from queue_app.engine.alias import queue_connection

    params = queue_connection(alias).get_connection_params()
    return PostgresSource(
        host=str(params.get("host") or ""),
        port=int(params.get("port") or 5432),
        dbname=params["dbname"],
        user=str(params.get("user") or ""),
        password=str(params.get("password") or ""),
        options={k: str(params[k]) for k in _LIBPQ_KEYS if params.get(k) not in (None, "")},
    )


def missing_jar_message() -> str:
    from queue_app.spark.session import JDBC_HINT, jdbc_jar_path

    return f"the PostgreSQL JDBC driver jar {jdbc_jar_path()} is missing ({JDBC_HINT})"


def resolve_reader(
    reader: Reader, source: PostgresSource, *, jar: str | None | bool = True
) -> Literal["jdbc", "psycopg"]:
    """The reader that will run. `jar` says whether the JDBC driver jar is installed (session.jdbc_jar()):
    without it, `auto` reads a TCP database through psycopg and `jdbc` is refused."""
    if reader == "auto":
        return "jdbc" if not source.is_socket and jar else "psycopg"
    if reader == "jdbc" and source.is_socket:
        raise ValueError(
            f"reader=jdbc needs PostgreSQL over TCP, but the database is on a unix socket "
            f"({source.host or 'default'}); use reader=auto or psycopg"
        )
    if reader == "jdbc" and not jar:
        raise ValueError(f"reader=jdbc: {missing_jar_message()}; reader=auto reads through psycopg instead")
    return reader


def read_postgres(
    spark: SparkSession,
    query: str,
    params: Mapping[str, Any] | None,
    *,
    schema: StructType,
    reader: Reader = "auto",
    partition_column: str | None = None,
    num_partitions: int = 4,
    bounds_query: str | None = None,
    source: PostgresSource | None = None,
) -> tuple[DataFrame, str]:
    """Rows of `query` (psycopg-style `%(name)s` parameters) as a DataFrame with `schema`, and the reader used.

    `partition_column` (integer, in the query's output) splits a JDBC read into `num_partitions` range reads
    between its min and max. `bounds_query` (same parameters) returns that (min, max) more cheaply than the
    default, which runs `query` once more; the bounds only spread the ranges, rows outside them are still read.
    """
    import psycopg

    from queue_app.spark.session import jdbc_jar

    source = source or postgres_source()
    used = resolve_reader(reader, source, jar=jdbc_jar())
    if used == "psycopg" and not source.is_socket:
        log.warning("reading PostgreSQL through psycopg in the driver, not JDBC: %s", missing_jar_message())
    with psycopg.connect(**source.psycopg_kwargs(), autocommit=True) as conn:
        # JDBC's dbtable takes SQL text, not bind parameters: render literals with psycopg's own quoting.
        sql_text = psycopg.ClientCursor(conn).mogrify(query, params or {})
        if used == "psycopg":
            return _read_psycopg(spark, conn, sql_text, schema), used
        bounds = None
        if partition_column and num_partitions > 1:
            default = f"SELECT min({partition_column}), max({partition_column}) FROM ({sql_text}) AS src"
            bounds = conn.execute(
                psycopg.ClientCursor(conn).mogrify(bounds_query, params or {}) if bounds_query else default
            ).fetchone()
    return _read_jdbc(spark, source, sql_text, schema, partition_column, num_partitions, bounds), used


def _read_jdbc(spark, source, sql_text, schema, partition_column, num_partitions, bounds) -> DataFrame:
    from pyspark.sql import functions as F

    props = {**source.jdbc_properties(), "fetchsize": "10000"}
    table = f"({sql_text}) AS src"
    if bounds and bounds[0] is not None:
        df = spark.read.jdbc(
            source.jdbc_url,
            table,
            column=partition_column,
            lowerBound=int(bounds[0]),
            upperBound=int(bounds[1]) + 1,
            numPartitions=num_partitions,
            properties=props,
        )
    else:
        df = spark.read.jdbc(source.jdbc_url, table, properties=props)
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def _read_psycopg(spark, conn, sql_text, schema) -> DataFrame:
    frames = []
    with conn.transaction(), conn.cursor(name="jobsite_spark_read") as cur:
        cur.itersize = PSYCOPG_CHUNK_ROWS
        cur.execute(sql_text)
        while rows := cur.fetchmany(PSYCOPG_CHUNK_ROWS):
            frames.append(spark.createDataFrame(rows, schema, verifySchema=False))
    if not frames:
        return spark.createDataFrame([], schema)
    return functools.reduce(lambda a, b: a.union(b), frames)
