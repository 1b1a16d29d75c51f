"""Pi estimation, as in Spark's examples/src/main/python/pi.py: pi.py [partitions] [samples per partition]."""

import random
import sys
from operator import add

from pyspark.sql import SparkSession

if __name__ == "__main__":
    spark = SparkSession.builder.appName("PythonPi").getOrCreate()
    partitions = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    n = (int(sys.argv[2]) if len(sys.argv) > 2 else 100000) * partitions

    def inside(_: int) -> int:
        x, y = random.random() * 2 - 1, random.random() * 2 - 1
        return 1 if x**2 + y**2 <= 1 else 0

    count = spark.sparkContext.parallelize(range(1, n + 1), partitions).map(inside).reduce(add)
    print(f"Pi is roughly {4.0 * count / n:f}")
    spark.stop()
