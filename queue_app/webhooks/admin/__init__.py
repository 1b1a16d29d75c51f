"""The webhooks app's admin, found by the admin's autodiscovery in every installed app: endpoints and deliveries
(pages.py). The models are this app's (label jobsite_webhooks): the pages live under
/admin/jobsite_webhooks/webhookendpoint/... and their template under admin/jobsite_webhooks/ (this app's
templates/ folder)."""

from django.apps import apps

# Without the apps it builds on, `check` says so (jobsite.E100) and no page is registered.
if not apps.get_app_config("jobsite_webhooks").missing():
    from . import pages as _pages  # noqa: F401  registers WebhookEndpoint and WebhookDelivery
