"""Datasets: the data jobs produce, declared next to them, cut into partitions with canonical keys, and recorded
as materializations (rows) in the transaction that makes them. See docs/how-to/datasets.md.

    from queue_app.datasets import Freshness, StaticPartitions, dataset

    dataset("daily_revenue", location="revenue/day={partition}", partitioning="daily",
            freshness=Freshness(partition_by="06:00"))

    from queue_app.datasets import services
    services.record_materialization("daily_revenue", "2026-11-26", rows=1200, spark_run_id=run.id)

- partitions.py: partitionings and their canonical keys; freshness.py: policies and freshness_state();
  locations.py: paths under the dataset roots, tables; declarations.py: dataset(), the settings' datasets;
  models.py: the rows; sql.py: their statements; services.py: the state changes; status.py: what the CLI
  and admin read; sync.py: declarations -> rows; checks.py: the system checks jobsite.E101-E105; refs.py: what
  jobs produce and consume (queue_app/spark/datasets.py records a Spark run's outputs and checks jobsite.E106).
"""

from .declarations import Dataset, DatasetError, dataset, declared_datasets, get_dataset
from .freshness import Freshness, freshness_state
from .partitions import DailyPartitions, HourlyPartitions, PartitionError, Partitioning, StaticPartitions

__all__ = [
    "DailyPartitions",
    "Dataset",
    "DatasetError",
    "Freshness",
    "HourlyPartitions",
    "PartitionError",
    "Partitioning",
    "StaticPartitions",
    "dataset",
    "declared_datasets",
    "freshness_state",
    "get_dataset",
]
