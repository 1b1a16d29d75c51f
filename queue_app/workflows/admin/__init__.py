"""The workflows app's admin, found by the admin's autodiscovery in every installed app: workflows (list, graph,
steps, start, backfill, repair: workflows.py), their versions and forks (versions.py) and the approvals
(approvals.py). The models are this app's (label jobsite_workflows): the pages live under
/admin/jobsite_workflows/workflow/... and their templates under admin/jobsite_workflows/ (this app's templates/
folder; they extend the core's admin/queue_app/ ones)."""

from django.apps import apps

# Without the apps it builds on, `check` says so (jobsite.E100) and no page is registered.
if not apps.get_app_config("jobsite_workflows").missing():
    from . import workflows as _workflows  # noqa: F401  registers Workflow (graph, steps, start, backfill)
