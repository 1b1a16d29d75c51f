"""sales_report.py that reports its own figures through jobsite's helper (plain Python, no Django).

reporting_sales.py <input.csv> <output_dir> <dataset> <day>
"""

import sys

from pyspark.sql import SparkSession

from jobsite import spark_report

if __name__ == "__main__":
    source, target, dataset, day = sys.argv[1:5]
    spark = SparkSession.builder.appName("ReportingSales").getOrCreate()
    spark.read.option("header", True).option("inferSchema", True).csv(source).createOrReplaceTempView("sales")
    report = spark.sql("SELECT region, count(*) AS orders, sum(amount) AS revenue FROM sales GROUP BY region")
    report.write.mode("overwrite").parquet(target)
    orders = report.groupBy().sum("orders").first()[0]
    taken = spark_report.materialized(
        dataset, day, rows=orders, metadata={"regions": report.count()}, preview=report.orderBy("region")
    )
    print(f"wrote {orders} orders to {target}; reported: {taken}")
    spark.stop()
