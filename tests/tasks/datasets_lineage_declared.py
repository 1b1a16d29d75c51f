"""Datasets and the Spark jobs between them for the lineage tests (`manage.py dataset --import
tests.tasks.datasets_lineage_declared` in the children, imported by the tests in their own process):

    ln_raw -> ln_clean_job -> ln_clean -> ln_agg_job -> ln_daily -> ln_report_job -> ln_report
    ln_raw -> ln_side_job -> ln_side                    ln_regions -> ln_agg_job
"""

from queue_app.datasets import dataset
from queue_app.spark import spark_job

for name in ("ln_raw", "ln_clean", "ln_daily", "ln_report", "ln_side", "ln_regions"):
    dataset(name, location=f"table:lineage.{name}")


@spark_job("ln_clean_job", consumes=["ln_raw"], produces=["ln_clean"])
def clean(spark, params): ...


@spark_job("ln_agg_job", consumes=["ln_clean", "ln_regions"], produces=["ln_daily"])
def agg(spark, params): ...


@spark_job("ln_report_job", consumes=["ln_daily"], produces=["ln_report"])
def report(spark, params): ...


@spark_job("ln_side_job", consumes=["ln_raw"], produces=["ln_side"])
def side(spark, params): ...
