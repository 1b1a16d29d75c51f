"""The datasets app's admin, found by the admin's autodiscovery in every installed app: the datasets (list, a
dataset's page, lineage, observe, materialize, partitions: datasets.py) and their check results (the override of
failed checks: checks.py). The models are this app's (label jobsite_datasets): the pages live under
/admin/jobsite_datasets/dataset/... and their templates under admin/jobsite_datasets/ (this app's templates/
folder; they extend the core's admin/queue_app/ ones)."""

from django.apps import apps

# Without the apps it builds on, `check` says so (jobsite.E100) and no page is registered.
if not apps.get_app_config("jobsite_datasets").missing():
    from . import checks as _checks  # noqa: F401  registers DatasetCheckResult (override action)
    from . import datasets as _datasets  # noqa: F401  registers Dataset (list, page, lineage, observe)
