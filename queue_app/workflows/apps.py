"""The workflows layer as a Django app a project adds to INSTALLED_APPS after `queue_app` and `queue_app.spark`:
`INSTALLED_APPS += ["queue_app", "queue_app.spark", "queue_app.workflows"]`, with the `workflows` extra
(graphviz, for the drawings).

It builds on the core app and on the Spark app (a workflow's Spark steps are Spark runs); installed without
either, `check` says which (jobsite.E100). It owns the definitions, the graph kept as rows and moved forward by
the database, waits, events and approvals, sub-workflows, its tasks (tasks.py), admin (workflows, versions,
approvals), templates and the `workflow` command. Its ready() registers on the core's hooks: "workflow"
schedule targets (schedules.py), the inbound events endpoint `/events/<source>/` under the core's one include
(inbound.py), the worker's drop of events no wait claimed within their lookback (waits.py); and its checks
(jobsite.E201: conditions; E113: workflows declaring datasets without the datasets app).

Its models are this app's (label jobsite_workflows, migrations/0001_initial.py); their tables keep the names the
core's migrations gave them (queue_app_workflow...).
"""

from typing import Any

from queue_app import layer_apps  # the module, not the class: Django takes the one AppConfig class found here


def receive_event(request: Any, source: str) -> Any:
    from .inbound import receive_event

    return receive_event(request, source)


def drop_expired_events(limit: int) -> int:
    from .waits import drop_expired_events

    return drop_expired_events(limit)


class WorkflowsConfig(layer_apps.LayerConfig):
    name = "queue_app.workflows"
    label = "jobsite_workflows"
    verbose_name = "Workflows"
    requires = ("queue_app", "queue_app.spark")
    extra = "workflows"
    extra_modules = ("graphviz",)

    def wire(self) -> None:
        from django.urls import path
        from django.views.decorators.csrf import csrf_exempt

        from queue_app import hooks

        from . import checks  # noqa: F401  registers jobsite.E201 (conditions) and E113
        from .schedules import TARGET

        hooks.schedule_targets["workflow"] = TARGET
        hooks.expired_drops.register(drop_expired_events)
        hooks.urls["workflow-events"] = path("events/<str:source>/", csrf_exempt(receive_event), name="workflow-events")
