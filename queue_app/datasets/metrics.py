"""The datasets' figures on /metrics (the core's `hooks.metric_collectors`): each declared dataset's freshness
and the OpenLineage emitter's drops."""

from collections.abc import Iterable
from typing import Any

from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .declarations import declared_datasets
from .openlineage import dropped_count
from .status import Staleness, staleness


class DatasetFreshnessCollector:
    """Per declared dataset with a freshness policy (docs/how-to/datasets.md): 1/0 fresh, and the seconds it is
    past its policy (no staleness sample for a missing dataset: nothing to measure from; it reads fresh 0)."""

    def __init__(self, datasets: Iterable[Staleness]) -> None:
        self.datasets = list(datasets)

    def collect(self) -> Iterable[Any]:
        fresh = GaugeMetricFamily(
            "jobsite_dataset_fresh",
            "1 while the dataset meets its freshness policy, 0 when it is stale or has never been materialized.",
            labels=["dataset"],
        )
        seconds = GaugeMetricFamily(
            "jobsite_dataset_staleness_seconds",
            "Seconds the dataset is past its freshness policy (0 while fresh; no sample while it has never been "
            "materialized).",
            labels=["dataset"],
        )
        for ds in self.datasets:
            fresh.add_metric([ds.name], int(ds.freshness == "fresh"))
            if ds.seconds is not None:
                seconds.add_metric([ds.name], ds.seconds)
        yield from (fresh, seconds)


class OpenLineageCollector:
    """The OpenLineage emitter's drops (datasets/openlineage.py), counted in one row shared by every process."""

    def __init__(self, dropped: int) -> None:
        self.dropped = dropped

    def collect(self) -> Iterable[Any]:
        yield CounterMetricFamily(
            "jobsite_openlineage_events_dropped",
            "OpenLineage events dropped: the transport failed or the emitter's queue was full.",
            value=self.dropped,
        )


def freshness_collector() -> DatasetFreshnessCollector:
    return DatasetFreshnessCollector(staleness(list(declared_datasets().values()), timezone.now()))


def openlineage_collector() -> OpenLineageCollector:
    return OpenLineageCollector(dropped_count())
