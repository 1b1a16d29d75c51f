"""Datasets with two dimensions for tests/datasets/in_process/test_datasets_dimensions_surfaces.py (the children import
them with `manage.py dataset --import tests.tasks.dimensions_declared`): sales by day and region (static), orders by day
and customer (a dynamic set), the Spark jobs that produce them with one parameter per dimension, and one that reads
a day of a region of sales; a workflow started by an update of orders (one parameter per dimension), and
accounts (by customer alone) produced by a task declared with `@job(produces=...)`."""

from queue_app.datasets import DynamicPartitions, MultiPartitions, StaticPartitions, dataset
from queue_app.params import Param
from queue_app.registry import job
from queue_app.spark.registry import spark_job
from queue_app.workflows.definition import workflow

REGIONS = ["apac", "eu", "us"]

dataset(
    "dim_sales",
    location="table:t.dim_sales",
    partitioning=MultiPartitions(day="daily", region=StaticPartitions(REGIONS)),
)
dataset(
    "dim_orders",
    location="table:t.dim_orders",
    partitioning=MultiPartitions(day="daily", customer=DynamicPartitions("dim_customers")),
)


@spark_job(
    "dim_sales_build",
    params=[Param("day", "date", required=True), Param("region", "str", required=True)],
    produces={"dim_sales": "day|region"},
)
def build(spark, params):
    return {}


@spark_job(
    "dim_orders_build",
    params=[Param("day", "date", required=True), Param("customer", "str", required=True)],
    produces={"dim_orders": "day|customer"},
)
def build_orders(spark, params):
    return {}


@spark_job(
    "dim_sales_report",
    params=[Param("day", "date", required=True), Param("region", "str", required=True)],
    consumes={"dim_sales": "day|region"},
)
def report(spark, params):
    return {}


@workflow(
    "dim_orders_flow",
    params=[Param("day", "date", required=True), Param("customer", "str", required=True)],
    on_update={"dim_orders": "day|customer"},
)
def orders_flow(wf, params):
    wf.task("queue_app.noop", name="only")


dataset("dim_accounts", location="table:t.dim_accounts", partitioning=DynamicPartitions("dim_customers"))


@job("tests.dim_accounts_build", produces=["dim_accounts"])
def build_accounts(payload, ctx):
    return {"rows": 1}
