"""Counts short and long words of a text file with a helper package shipped by --py-files:
spark-submit --py-files textstats.zip letter_stats.py <file>."""

import sys

import textstats  # not installed: spark-submit --py-files puts it on the driver's and the executors' path
from pyspark.sql import SparkSession

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("Usage: letter_stats <file>", file=sys.stderr)
        sys.exit(-1)
    spark = SparkSession.builder.appName("PythonLetterStats").getOrCreate()
    lines = spark.read.text(sys.argv[1]).rdd.map(lambda r: r[0])
    # The lambdas call the helper inside the executors' Python workers, so it must be shipped there too.
    counts = lines.flatMap(textstats.words).map(lambda w: (textstats.kind(w), 1)).reduceByKey(lambda a, b: a + b)
    for kind, count in sorted(counts.collect()):
        print(f"{kind}: {count}")
    print(f"helper loaded from: {textstats.__file__}")
    spark.stop()
