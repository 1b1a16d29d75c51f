"""jobsite's URLs for machines, as one `include()`: `/metrics` (Prometheus), `/healthz`, and the layers' (hooks.urls:
the workflows app's `/events/<source>/`, signed workflow events, workflows/inbound.py).

    urlpatterns = [..., path("jobsite/", include("queue_app.urls"))]

The admin's pages come with the admin site (`admin.site.urls`), nothing to add for them.
"""

from django.urls import path

from . import health, hooks, metrics

app_name = "jobsite"

urlpatterns = [
    path("metrics", metrics.metrics, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    *hooks.urls.values(),
]
