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
  and admin read; sync.py: declarations -> rows; checks.py: the system checks jobsite.E101-E105 and E120-E122;
  dynamic.py: the dynamic partition sets' keys; mappings.py: which upstream partitions a consumer's partition
  reads; refs.py: what jobs produce and consume, read from the core's vocabulary (queue_app/dataset_refs.py);
  spark_runs.py: a Spark run's dataset steps on its hooks (spark/hooks.py: records its outputs, checks
  jobsite.E106, refuses or parks a run whose inputs failed their blocking checks), spark_lineage.py its
  OpenLineage events; quality.py: data checks (check(),
  schema_check()); checks_run.py: how they run, settle a materialization's checks state, and are overridden;
  triggers.py: the hook called when a materialization becomes usable; stale.py: the dataset.stale event and,
  for a dataset declared with trigger_producer_when_stale, its producer (producers.py) started once per episode.
"""

from .declarations import Dataset, DatasetError, dataset, declared_datasets, get_dataset
from .freshness import Freshness, freshness_state
from .partitions import (
    DailyPartitions,
    DynamicPartitions,
    HourlyPartitions,
    MultiPartitions,
    PartitionError,
    Partitioning,
    StaticPartitions,
    WeeklyPartitions,
)

__all__ = [
    "DailyPartitions",
    "Dataset",
    "DatasetError",
    "DynamicPartitions",
    "Freshness",
    "HourlyPartitions",
    "MultiPartitions",
    "PartitionError",
    "Partitioning",
    "StaticPartitions",
    "WeeklyPartitions",
    "dataset",
    "declared_datasets",
    "freshness_state",
    "get_dataset",
]
