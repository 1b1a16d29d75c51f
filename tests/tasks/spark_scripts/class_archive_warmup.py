"""The work whose classes `tests/support/spark_jvm.py` archives: what the suite's Spark JVMs do at start and in
their first jobs (a local session with its UI and event log, a shuffle, SQL with a join, Parquet and JSON lines
written and read, a Python UDF). Run by spark-submit: `class_archive_warmup.py WORKDIR`."""

import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

work = Path(sys.argv[1])
(work / "events").mkdir(parents=True, exist_ok=True)
spark = (
    SparkSession.builder.appName("class-archive-warmup")
    .config("spark.ui.enabled", "true")
    .config("spark.ui.port", "0")
    .config("spark.eventLog.enabled", "true")
    .config("spark.eventLog.dir", f"file://{work / 'events'}")
    .config("spark.sql.session.timeZone", "UTC")
    .getOrCreate()
)
numbers = spark.range(2000).withColumn("bucket", F.col("id") % 7)
counts = numbers.groupBy("bucket").agg(F.count("*").alias("rows"), F.sum("id").alias("total"))
counts.write.mode("overwrite").parquet(str(work / "counts"))
(work / "lines").mkdir(exist_ok=True)
(work / "lines" / "day=2026-01-01.json").write_text('{"word": "a", "n": 1}\n{"word": "b", "n": 2}\n')
lines = spark.read.json(str(work / "lines"))
joined = spark.read.parquet(str(work / "counts")).join(lines, F.col("bucket") == F.col("n"), "left")
joined.createOrReplaceTempView("joined")
spark.sql("SELECT bucket, max(total) AS top FROM joined GROUP BY bucket ORDER BY bucket").collect()
shout = F.udf(lambda word: (word or "").upper())
lines.select(shout("word")).collect()
spark.stop()
