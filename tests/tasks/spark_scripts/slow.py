"""Tasks that sleep (for cancel): slow.py <tasks> <seconds>."""

import sys
import time

from pyspark.sql import SparkSession

if __name__ == "__main__":
    spark = SparkSession.builder.appName("Slow").getOrCreate()
    tasks, seconds = int(sys.argv[1]), float(sys.argv[2])
    spark.sparkContext.parallelize(range(tasks), tasks).foreach(lambda _: time.sleep(seconds))
    spark.stop()
