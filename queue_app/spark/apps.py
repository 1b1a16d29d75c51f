"""The Spark layer as a Django app a project adds to INSTALLED_APPS after `queue_app`:
`INSTALLED_APPS += ["queue_app", "queue_app.spark"]`, with the `spark` extra (pyspark) and Java 17+.

It builds on the core app (`queue_app`; installed without it, `check` says so: jobsite.E100). It owns the
registered jobs and stored scripts, the runs as queue work (tasks.py: `queue_app.spark_run`), the launcher and
the warm Spark Connect server, its admin (the runs' dashboard, scripts), templates and commands (`spark_run`,
`spark_sample_data`, `spark_connect_server`), and publishes its own hooks (spark/hooks.py) for the datasets app.
Its ready() registers on the core's hooks: "spark" schedule targets (schedules.py) and what `queue_app.prune`
removes besides the queue's own (runs past their retention, event logs); and its checks (jobsite.W010: Java;
E113: jobs declaring datasets without the datasets app).

Its models are this app's (label jobsite_spark, migrations/0001_initial.py); their tables keep the names the
core's migrations gave them (queue_app_sparkrun...). Cancelling a run's queue item cancels the run through the
core's `cancel_requested` hook (cancel.py).
"""

from queue_app import layer_apps  # the module, not the class: Django takes the one AppConfig class found here


def prune_runs() -> int:
    from .runs import prune_runs

    return prune_runs()


def prune_event_logs() -> int:
    from .runs import prune_event_logs

    return prune_event_logs()


class SparkConfig(layer_apps.LayerConfig):
    name = "queue_app.spark"
    label = "jobsite_spark"
    verbose_name = "Spark"
    requires = ("queue_app",)
    extra = "spark"
    extra_modules = ("pyspark",)

    def wire(self) -> None:
        from queue_app import hooks

        from . import checks  # noqa: F401  registers jobsite.W010 (Java) and E113 (datasets without their app)
        from .cancel import cancel_runs_of_items
        from .schedules import TARGET

        hooks.schedule_targets["spark"] = TARGET
        hooks.cancel_requested.register(cancel_runs_of_items)  # an open run is cancelled with its item
        hooks.prunes["spark_runs"] = prune_runs  # the runs module is imported when the prune runs
        hooks.prunes["spark_event_logs"] = prune_event_logs
