"""The Spark app's admin, found by the admin's autodiscovery in every installed app: the runs' dashboard (list, a
run's page, trigger, cancel, re-run: runs.py) and the stored scripts (scripts.py). The models are this app's
(label jobsite_spark): the pages live under /admin/jobsite_spark/sparkrun/... and their templates under
admin/jobsite_spark/ (this app's templates/ folder; they extend the core's admin/queue_app/ ones)."""

from django.apps import apps

# Without the apps it builds on, `check` says so (jobsite.E100) and no page is registered.
if not apps.get_app_config("jobsite_spark").missing():
    from . import runs as _runs  # noqa: F401  registers SparkRun
    from . import scripts as _scripts  # noqa: F401  registers SparkScript
