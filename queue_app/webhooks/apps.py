"""The webhooks layer as a Django app a project adds to INSTALLED_APPS after `queue_app`:
`INSTALLED_APPS += ["queue_app", "queue_app.webhooks"]`, with the `webhooks` extra (httpx, which sends them).

It builds on the core app (`queue_app`; installed without it, `check` says so: jobsite.E100). Its ready()
registers on the core's events (queue_app/events.py, through hooks.event_published) the function that writes a
delivery per subscribed endpoint in the publishing transaction, and its tasks (tasks.py: the delivery and the
SQL-raised events' publish), and, when the workflows app is installed too, a workflow's end as an event
(workflow_events.py). Its admin (endpoints, deliveries), its `webhooks`
command and its templates are the app's.

Its models are this app's (label jobsite_webhooks, migrations/0001_initial.py); their tables keep the names the
core's migrations gave them (queue_app_webhookendpoint...). The receiving side (queue_app/receiver.py, the
replay table) is the core's: inbound events reach workflows without this app.
"""

from queue_app import layer_apps  # the module, not the class: Django takes the one AppConfig class found here


class WebhooksConfig(layer_apps.LayerConfig):
    name = "queue_app.webhooks"
    label = "jobsite_webhooks"
    verbose_name = "Webhooks"
    requires = ("queue_app",)
    extra = "webhooks"
    extra_modules = ("httpx",)

    def wire(self) -> None:
        from django.apps import apps

        from queue_app import hooks

        from . import tasks  # noqa: F401  registers the delivery and publish tasks
        from .events import publish_event

        hooks.event_published.register(publish_event)
        if apps.is_installed("queue_app.workflows"):
            from . import workflow_events  # noqa: F401  a workflow's end as an event (workflow_finished)
