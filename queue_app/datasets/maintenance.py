"""The datasets' maintenance units (the core's `hooks.maintenance_units`), which the core's tasks
`queue_app.dataset_staleness` and `queue_app.dataset_watch` run for the shipped schedules of those names."""

from typing import Any


def staleness() -> dict[str, Any]:
    """Send `dataset.stale` for each dataset that went past its freshness policy since the last check."""
    from .stale import publish_stale

    return {"stale": publish_stale()}


def watch() -> dict[str, Any]:
    """Observe each file-arrival watch's partitions whose set of files is new."""
    from .watches import check_watches

    return {"observed": [m.id for m in check_watches()]}
