"""The datasets layer as a Django app a project adds to INSTALLED_APPS after `queue_app`:
`INSTALLED_APPS += ["queue_app", "queue_app.datasets"]` (docs/how-to/adopt.md).

It depends on the core app (`queue_app`), whose Spark runs and workflows its jobs' triggers, producers and
backfills start (Spark is not an app of its own yet: the dependency is on `queue_app`). Installed without it,
`check` says so (jobsite.E100) and nothing of the layer is wired. Its ready() registers what the core calls
through its hooks (queue_app/hooks.py): why an item is held (a parked item's unusable inputs), a producer task's
success (its materialization), /metrics' dataset figures, the shipped staleness and watch schedules' units; on
the Spark run's hooks (spark/hooks.py) its dataset steps (datasets/spark_runs.py: its partitions checked when it
is triggered, parked on unusable inputs, its materializations recorded with its success) and its OpenLineage
events (datasets/spark_lineage.py); and
the layer's own checks, triggers and producers, and the datasets' sync after `migrate`.

Its models are this app's (label jobsite_datasets, migrations/0001_initial.py); their tables keep the names the
core's migrations gave them (queue_app_dataset...).
"""

from queue_app import layer_apps  # the module, not the class: Django takes the one AppConfig class found here


class DatasetsConfig(layer_apps.LayerConfig):
    name = "queue_app.datasets"
    label = "jobsite_datasets"
    verbose_name = "Datasets"
    requires = ("queue_app", "queue_app.spark", "queue_app.workflows")  # its triggers start runs and workflows
    extra = "datasets"
    extra_modules = ("graphviz", "openlineage.client")

    def wire(self) -> None:
        from django.db.models.signals import post_migrate

        from queue_app import dataset_refs, hooks
        from queue_app.workflows import hooks as workflow_hooks

        from . import (
            checks as dataset_checks,  # noqa: F401  registers jobsite.E101-E105, E120-E122
        )
        from . import (
            dynamic,  # noqa: F401  the dynamic partition sets' lookup (partitions.py)
            maintenance,
            metrics,
            openlineage,  # noqa: F401  registers jobsite.E131 (the OPENLINEAGE setting)
            spark_lineage,  # a Spark run's OpenLineage events
            spark_producers,  # noqa: F401  the Spark jobs as producers (stale datasets)
            spark_runs,  # registers jobsite.E106 (the jobs' datasets); a Spark run's dataset steps
            spark_triggers,  # noqa: F401  the Spark jobs' data-aware triggers
            workflow_triggers,  # the workflows' data-aware triggers, start checks and open runs of a key
        )
        from .checks_run import blocked_items
        from .producers import producer_succeeded
        from .refs import ref_problems
        from .sync import sync_after_migrate

        hooks.held_reasons.register(blocked_items)
        hooks.producer_succeeded.register(producer_succeeded)
        hooks.metric_collectors.register(metrics.freshness_collector)
        hooks.metric_collectors.register(metrics.openlineage_collector)
        hooks.maintenance_units["dataset_staleness"] = maintenance.staleness
        hooks.maintenance_units["dataset_watch"] = maintenance.watch
        workflow_hooks.start_checks.register(workflow_triggers.check_start)  # a dynamic key held while it starts
        dataset_refs.problems.register(ref_problems)  # the jobs' declared datasets (queue_app/dataset_refs.py)
        spark_runs.register()  # on the Spark run's hooks (spark/hooks.py)
        spark_lineage.register()
        post_migrate.connect(sync_after_migrate, sender=self, dispatch_uid="jobsite-datasets-sync")
