"""A script that fails with a Python exception after running a Spark job."""

from pyspark.sql import SparkSession

if __name__ == "__main__":
    spark = SparkSession.builder.appName("Failing").getOrCreate()
    rows = spark.range(10).count()
    raise ValueError(f"bad input: expected 11 rows, found {rows}")
