"""A DataFrame/SQL program: read a CSV of sales, total them per region with SQL, write Parquet.

sales_report.py <input.csv> <output_dir>
"""

import sys

from pyspark.sql import SparkSession

if __name__ == "__main__":
    source, target = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.appName("SalesReport").getOrCreate()
    spark.read.option("header", True).option("inferSchema", True).csv(source).createOrReplaceTempView("sales")
    report = spark.sql("SELECT region, count(*) AS orders, sum(amount) AS revenue FROM sales GROUP BY region")
    report.write.mode("overwrite").parquet(target)
    print(f"wrote {report.count()} regions to {target}")
    spark.stop()
